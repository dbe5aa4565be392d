"""Admin form fields that speak in units: slot amounts and durations as people type them.

The stored values stay what they were (slot mappings of exact decimal strings, ``mem`` in bytes;
``timedelta``); only what an admin reads and types changes. Every text goes through
``bai_common.units``, so ``2g`` and ``1h30m`` mean here what they mean at the API.
"""

from __future__ import annotations

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
from . import slots as slotlib

# slot -> (label, unit shown after the input). GPUs are counted, so the label is the unit;
# other slots in settings.BAI_SLOT_TYPES get their own name and no unit.
SLOT_LABELS = {
    "cpu": ("CPU", "cores"),
    "mem": ("Memory", "GiB"),
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
            slot: forms.TextInput(attrs={"size": 8, "class": "bai-slot-input"})
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
