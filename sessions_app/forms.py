"""Admin form fields that speak as people do: slot amounts, sizes and durations with units,
agent-selector options as ``key = value`` lines, an image's apps one per line.

The stored values stay what they were (slot mappings of exact decimal strings, ``mem`` in bytes;
byte counts; ``timedelta``; JSON lists and objects); only what an admin reads and types changes.
Every text goes through ``bai_common.units``, so ``2g`` and ``1h30m`` mean here what they mean
at the API, and an image's apps go through ``service_ports.declaration_errors``, as at the model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django import forms
from django.conf import settings
from django.utils.dateparse import parse_duration as parse_django_duration

from bai_common import units

from . import policy as rules
from . import service_ports
from . import slots as slotlib

# slot -> (label, unit shown after the input). GPUs are counted, so the label is the unit;
# other slots in settings.BAI_SLOT_TYPES get their own name and no unit.
# Memory has no unit after its input: the input shows its own ("64 MiB"), and a bare number
# typed there is GiB (SLOT_HELP and the placeholder say so).
SLOT_LABELS = {
    "cpu": ("CPU", "cores"),
    "mem": ("Memory", ""),
    "cuda.device": ("GPUs", ""),
    "cuda.shares": ("GPU shares", ""),
}
SLOT_HELP = (
    "CPU in cores (0.5 is half a core); memory in GiB, or with a unit: 512m, 2g, 1.5 GiB; "
    "GPUs as a count."
)
DURATION_HELP = (
    "Type 30m, 8h, 1d or 1h30m (d, h, m, s); a bare number is seconds; 0 is the same as empty."
)
# A bare number in the memory input means GiB, as the label next to it says.
_BARE_NUMBER = re.compile(r"[0-9]+(\.[0-9]+)?")
# The admin's own additions (slot inputs, usage bars, notes): a static file, no inline style.
ADMIN_CSS = {"all": ["css/admin.css"]}


def slot_label(slot: str) -> str:
    return SLOT_LABELS.get(slot, (slot, ""))[0]


def slot_unit(slot: str) -> str:
    return SLOT_LABELS.get(slot, (slot, ""))[1]


def parse_slot_input(slot: str, text: str) -> Decimal:
    """One slot's amount as typed in its input: ``mem`` in GiB unless a unit is given."""
    text = text.strip()
    if slot == "mem" and _BARE_NUMBER.fullmatch(text):
        text = f"{text}g"
    return slotlib.parse_slot_value(slot, text)


def slots_text(slots: Mapping[str, Any] | None, *, empty: str = "—") -> str:
    """``{"cpu": "2", "mem": "4294967296"}`` -> ``2 cpu, 4 GiB mem`` (for lists and read-only
    fields; memory in the largest unit it reaches, ``23.5 GiB mem``, as the pages show it)."""
    if not slots:
        return empty
    parsed = slotlib.from_strings(slots)
    return ", ".join(
        f"{units.format_size_shown(value)} mem" if slot == "mem" else slotlib.fmt(slot, value)
        for slot, value in parsed.items()
    )


class SlotsWidget(forms.MultiWidget):
    """One labelled input per known slot, with its unit after it."""

    template_name = "sessions_app/widgets/slots.html"

    def __init__(self, slot_names: Sequence[str], attrs: dict[str, Any] | None = None) -> None:
        self.slot_names = list(slot_names)
        widgets = {
            # The suffix names the slot: the input is <name>_cpu, <name>_mem, ...
            slot: forms.TextInput(
                attrs={"size": 8, "class": "bai-slot-input"}
                | ({"placeholder": "e.g. 4 GiB"} if slot == "mem" else {})
            )
            for slot in self.slot_names
        }
        super().__init__(widgets, attrs)

    class Media:
        css = ADMIN_CSS

    def decompress(self, value: Any) -> list[str]:
        if not isinstance(value, Mapping):
            return [""] * len(self.slot_names)
        shown = []
        for slot in self.slot_names:
            raw = value.get(slot)
            try:
                shown.append("" if raw is None else units.format_amount(slot, Decimal(str(raw))))
            except ArithmeticError:  # a stored value nobody can read: show it as it is
                shown.append(str(raw))
        return shown

    def get_context(self, name: str, value: Any, attrs: dict[str, Any] | None) -> dict[str, Any]:
        context = super().get_context(name, value, attrs)
        for slot, subwidget in zip(self.slot_names, context["widget"]["subwidgets"], strict=True):
            subwidget["slot_label"] = slot_label(slot)
            subwidget["slot_unit"] = slot_unit(slot)
        return context


class SlotsField(forms.MultiValueField):
    """A slot mapping, typed slot by slot with units; stored as exact decimal strings.

    An empty input leaves its slot out (for a quota: unlimited; for minimums: none). ``0`` stays
    a value. ``required_slots`` must be given and more than zero (a preset's cpu and mem).
    """

    def __init__(
        self,
        *,
        slot_names: Sequence[str] | None = None,
        required_slots: Sequence[str] = (),
        empty_means: str = "",
        **kwargs: Any,
    ) -> None:
        self.slot_names = list(slot_names or settings.BAI_SLOT_TYPES)
        self.required_slots = tuple(required_slots)
        help_text = " ".join(t for t in (empty_means, kwargs.pop("help_text", ""), SLOT_HELP) if t)
        fields = [
            forms.CharField(required=False, max_length=units.MAX_TEXT) for _ in self.slot_names
        ]
        super().__init__(
            fields,
            widget=SlotsWidget(self.slot_names),
            require_all_fields=False,
            help_text=help_text,
            **{**kwargs, "required": False},
        )

    def compress(self, data_list: list[str]) -> dict[str, str]:
        data_list = data_list or [""] * len(self.slot_names)
        out: dict[str, str] = {}
        errors: list[str] = []
        for slot, text in zip(self.slot_names, data_list, strict=True):
            label = slot_label(slot)
            if not text or not text.strip():
                if slot in self.required_slots:
                    errors.append(f"{label}: required")
                continue
            try:
                amount = parse_slot_input(slot, text)
            except slotlib.SlotError as exc:
                errors.append(f"{label}: {exc.message}")
                continue
            refusal = rules.slot_value_refusal(slot, amount)
            if refusal is not None:
                errors.append(f"{label}: {refusal.partition(': ')[2]}")
            elif slot in self.required_slots and amount <= 0:
                errors.append(f"{label}: must be more than 0")
            else:
                out[slot] = units.format_decimal(amount)
        if errors:
            raise forms.ValidationError(errors)
        return out


class DurationInput(forms.Field):
    """A duration typed as ``30m``, ``8h``, ``1d`` or ``1h30m`` and shown the same way
    (``1 h 30 min``); empty is None ("never" / "unlimited", as the model's help says)."""

    widget = forms.TextInput(attrs={"size": 12, "placeholder": "e.g. 30m, 8h, 1d"})

    def __init__(self, **kwargs: Any) -> None:
        kwargs["help_text"] = " ".join(t for t in (kwargs.get("help_text"), DURATION_HELP) if t)
        super().__init__(**kwargs)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, timedelta):
            return units.format_duration(value)
        return value

    def to_python(self, value: Any) -> timedelta | None:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        if isinstance(value, timedelta):
            return value
        text = str(value).strip()
        try:
            duration = units.parse_duration(text)
        except ValueError as exc:
            # Django's own form ("1 02:30:00", "0:30:00"), as this field accepted before.
            duration = parse_django_duration(text) if ":" in text else None
            if duration is None:
                raise forms.ValidationError(str(exc)) from None
        if duration == timedelta(0):
            return None  # 0, like empty, means none (no timeout, no limit)
        if duration < timedelta(seconds=1):
            raise forms.ValidationError("at least 1 s (leave it empty or 0 for none)")
        if duration > units.MAX_DURATION:
            raise forms.ValidationError(
                f"at most {units.format_duration(units.MAX_DURATION)} (leave it empty for none)"
            )
        return duration

    def has_changed(self, initial: Any, data: Any) -> bool:
        try:
            return self.to_python(data) != initial
        except forms.ValidationError:
            return True


SIZE_HELP = "Type 512 MiB, 64g, 2 GiB or 1.5 TiB (binary units); a bare number is bytes."


class SizeInput(forms.Field):
    """A size in bytes, typed and shown with a binary unit (``64 MiB``, ``2 GiB``); empty is None
    (unlimited, as the model's help says). Shown exactly, so saving unchanged keeps the bytes."""

    widget = forms.TextInput(attrs={"size": 12, "placeholder": "e.g. 10 GiB"})

    def __init__(self, **kwargs: Any) -> None:
        kwargs["help_text"] = " ".join(t for t in (kwargs.get("help_text"), SIZE_HELP) if t)
        super().__init__(**kwargs)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return units.format_size(value)
        return value

    def to_python(self, value: Any) -> int | None:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return units.parse_size(str(value))
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def has_changed(self, initial: Any, data: Any) -> bool:
        try:
            return self.to_python(data) != initial
        except forms.ValidationError:
            return True


class SessionTypesField(forms.TypedMultipleChoiceField):
    """The session types a resource group runs, as one checkbox each; stored as a JSON list."""

    widget = forms.CheckboxSelectMultiple

    def __init__(self, *, choices: Sequence[tuple[str, str]], **kwargs: Any) -> None:
        kwargs.setdefault("help_text", "None ticked: no session may start in this group.")
        super().__init__(choices=choices, required=False, **kwargs)

    def prepare_value(self, value: Any) -> Any:
        # A stored list as the boxes to tick; anything else a row holds ticks none.
        return [v for v in value if isinstance(v, str)] if isinstance(value, list) else value


MAX_OPTIONS = 32
MAX_OPTION_LINE = 1000
OPTION_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
OPTIONS_HELP = (
    "One option per line, as key = value: prefix = gpu- (text), spread = true, limit = 4. "
    'A value in JSON form ("quoted", [lists]) is read as JSON. Empty: no options. '
    "A JSON object pasted whole is read as it is."
)


class KeyValueOptionsField(forms.Field):
    """A JSON object typed as ``key = value`` lines (the agent selector's options).

    A value that is JSON (a number, true/false/null, "text", a list or an object) is read as
    JSON; anything else is text. Keys are checked here; what they mean is the selector's.
    """

    widget = forms.Textarea(attrs={"rows": 3, "cols": 50, "class": "bai-mono"})

    def __init__(self, **kwargs: Any) -> None:
        kwargs["help_text"] = " ".join(t for t in (kwargs.get("help_text"), OPTIONS_HELP) if t)
        kwargs["required"] = False
        super().__init__(**kwargs)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, Mapping):
            return "\n".join(
                f"{key} = {item if _reads_as_text(item) else json.dumps(item)}"
                for key, item in value.items()
            )
        return value

    def to_python(self, value: Any) -> Any:
        if isinstance(value, Mapping):
            return dict(value)
        text = _bounded_text(value, MAX_OPTIONS * MAX_OPTION_LINE)
        if not text:
            return {}
        if text.startswith(("{", "[")):
            try:
                whole = json.loads(text)
            except ValueError:
                raise forms.ValidationError(
                    'A JSON object, such as {} or {"prefix": "gpu-"}, or key = value lines.'
                ) from None
            if not isinstance(whole, dict):
                raise forms.ValidationError('A JSON object, such as {} or {"prefix": "gpu-"}.')
            return whole
        options: dict[str, Any] = {}
        errors: list[str] = []
        lines = [line.strip() for line in text.splitlines()]
        for number, line in enumerate(lines, 1):
            if not line:
                continue
            key, equals, raw = (part.strip() for part in line.partition("="))
            if not equals:
                errors.append(f"line {number}: write key = value")
            elif len(line) > MAX_OPTION_LINE:
                errors.append(f"line {number}: at most {MAX_OPTION_LINE} characters")
            elif not OPTION_KEY.fullmatch(key):
                errors.append(
                    f"line {number}: a key is up to 64 letters, digits, '_', '.' or '-', "
                    "starting with a letter or '_'"
                )
            elif key in options:
                errors.append(f"line {number}: {key!r} is given twice")
            else:
                options[key] = _option_value(raw)
        if len(options) > MAX_OPTIONS:
            errors.append(f"at most {MAX_OPTIONS} options")
        if errors:
            raise forms.ValidationError(errors)
        return options

    def has_changed(self, initial: Any, data: Any) -> bool:
        try:
            return self.to_python(data) != (initial or {})
        except forms.ValidationError:
            return True


def _bounded_text(value: Any, limit: int) -> str:
    """The stripped text of an input, refused past ``limit`` characters before it is read."""
    text = "" if value is None else str(value)
    if len(text) > limit:
        raise forms.ValidationError(f"at most {limit} characters (got {len(text)})")
    return text.strip()


def _option_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _reads_as_text(item: Any) -> bool:
    """A text value written bare reads back as the same text (not as a number or JSON)."""
    return isinstance(item, str) and item == item.strip() and _option_value(item) == item


SERVICE_PORTS_HELP = (
    "One app per line: name protocol port [start command], e.g. "
    "“tensorboard http 6006 exec tensorboard --logdir $HOME --host $BAI_APP_BIND "
    "--port $BAI_APP_PORT”. Protocol http or tcp; port 1024-65535. A start command starts the "
    "app on demand (with $BAI_APP_BIND, $BAI_APP_PORT and $BAI_APP_TOKEN set); without one, "
    "something in the image must listen on the port."
)


class ServicePortsField(forms.Field):
    """An image's apps (``service_ports``), one per line: ``name protocol port [command]``.

    Checked line by line with ``service_ports.declaration_errors``, whose "item N" becomes
    "line N"; stored as the same JSON list as before.
    """

    widget = forms.Textarea(attrs={"rows": 4, "cols": 90, "class": "bai-mono", "wrap": "off"})

    def __init__(self, **kwargs: Any) -> None:
        kwargs["help_text"] = SERVICE_PORTS_HELP
        kwargs["required"] = False
        super().__init__(**kwargs)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, list) and all(isinstance(item, Mapping) for item in value):
            return "\n".join(
                " ".join(
                    str(part)
                    for part in (
                        item.get("name", ""),
                        item.get("protocol", ""),
                        item.get("port", ""),
                        item.get("start_command", ""),
                    )
                    if part != ""
                )
                for item in value
            )
        return value

    def to_python(self, value: Any) -> Any:
        if isinstance(value, list):
            return value
        limit = service_ports.MAX_DECLARED * (service_ports.MAX_START_COMMAND + 64)
        text = _bounded_text(value, limit)
        if not text:
            return []
        declared: list[dict[str, Any]] = []
        shape: list[str] = []
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        for number, line in enumerate(lines, 1):
            parts = line.split(None, 3)
            if len(parts) < 3:
                shape.append(f"line {number}: write name protocol port [start command]")
                continue
            name, protocol, port = parts[:3]
            item: dict[str, Any] = {
                "name": name,
                "protocol": protocol,
                "port": int(port) if port.isdecimal() and len(port) <= 5 else port,
            }
            if len(parts) == 4:
                item["start_command"] = parts[3]
            declared.append(item)
        errors = shape or [
            re.sub(r"^item (\d+):", r"line \1:", e)
            for e in service_ports.declaration_errors(declared)
        ]
        if errors:
            raise forms.ValidationError(errors)
        return declared

    def has_changed(self, initial: Any, data: Any) -> bool:
        try:
            return self.to_python(data) != (initial or [])
        except forms.ValidationError:
            return True
