"""What changed in a shard job's inputs since an earlier run, for the rerun's report ("3 inputs added, 1 changed").

It lives with the shard job: the engine's markers record each unit's input names and stamps; only the shard
command compares them and names the inputs that changed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fgdata.jobs.units import Marker, Unit

#: How many names of added, removed or changed inputs a report lists.
NAMED = 5


@dataclass
class Named:
    """A count of inputs and the first few of their names."""

    count: int = 0
    names: list[str] = field(default_factory=list)

    def add(self, name: str) -> None:
        self.count += 1
        if len(self.names) < NAMED:
            self.names.append(name)


@dataclass
class InputDiff:
    """What changed in the inputs since an earlier run, told from the markers of the units whose inputs differ,
    met in unit order: inputs added, removed, and replaced (same name, another stamp). An input that only moved
    to another unit (one added before it) is none of these. Memory holds the names not matched yet: those that
    moved (as many as were added or removed before them) and those truly added or removed."""

    added: Named = field(default_factory=Named)
    removed: Named = field(default_factory=Named)
    changed: Named = field(default_factory=Named)
    came: dict[str, str] = field(default_factory=dict)  # in a new unit, not yet met in an earlier run's marker
    gone: dict[str, str] = field(default_factory=dict)  # in an earlier run's marker, not yet met in a new unit

    def _meet(self, name: str, stamp: str, other: dict[str, str], mine: dict[str, str]) -> None:
        if name not in other:
            mine[name] = stamp
        elif other.pop(name) != stamp:
            self.changed.add(name)

    def compare(self, old: Marker | None, unit: Unit[Any], appended: bool) -> None:
        """``unit`` against the earlier run's marker of the same number (None: none to compare; ``appended``:
        the unit lies after every unit of the earlier run)."""
        if old is None:
            if appended:  # every earlier unit came before: an input not met yet is new
                for item, stamp in zip(unit.items, unit.stamps, strict=True):
                    was = self.gone.pop(item.name, None)
                    if was is None:
                        self.added.add(item.name)
                    elif was != stamp:
                        self.changed.add(item.name)
            return
        for name, stamp in zip(old.names, old.stamps, strict=True):
            self._meet(name, stamp, self.came, self.gone)
        for item, stamp in zip(unit.items, unit.stamps, strict=True):
            self._meet(item.name, stamp, self.gone, self.came)

    def end(self, tail: Iterable[Marker]) -> None:
        """Close the comparison with the earlier run's markers beyond this run's last unit."""
        for old in tail:
            for name, stamp in zip(old.names, old.stamps, strict=True):
                self._meet(name, stamp, self.came, self.gone)
        for name in self.came:
            self.added.add(name)
        for name in self.gone:
            self.removed.add(name)
        self.came, self.gone = {}, {}
