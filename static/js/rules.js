// One autoscaling rule: read from the fields of templates/serving/_rule_fields.html (the New
// endpoint dialog and the endpoint's page), and said in words.

const WORDS = { gt: ">", ge: "≥", lt: "<", le: "≤" };

function number(input) {
  return input.value.trim() === "" ? undefined : Number(input.value);
}

// The API's rule body from a form's elements, or null when no metric is chosen.
export function ruleFromForm(f, bounds = {}) {
  if (!f.rule_metric.value) return null;
  const rule = {
    metric: f.rule_metric.value,
    comparator: f.rule_comparator.value,
    threshold: number(f.rule_threshold),
    step: number(f.rule_step),
    cooldown: number(f.rule_cooldown),
    ...bounds,
  };
  return Object.fromEntries(Object.entries(rule).filter(([, v]) => v !== undefined));
}

export function describeRule(r) {
  const step = `${r.step > 0 ? "+" : ""}${r.step}`;
  return `${r.metric} ${WORDS[r.comparator] || r.comparator} ${r.threshold} → ${step} replica(s), cooldown ${r.cooldown} s, ${r.min_replicas}–${r.max_replicas}`;
}
