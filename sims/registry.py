"""Named registries (backends, policy families, RL algorithms, ...): a name -> entry table with one
error for an unknown name, naming the closest one.

Entries are often ``"module:attr"`` strings, imported only when used (:func:`load_attr`), so that
listing what is registered loads no simulator or model code.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any, Iterable, Iterator, Mapping, Optional, TypeVar

T = TypeVar("T")


def closest_key(word: str, choices: Iterable[str]) -> Optional[str]:
    """The choice nearest to ``word`` (:func:`difflib.get_close_matches`), or None if none is close."""
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return match[0] if match else None


def load_attr(target: Any) -> Any:
    """The object a ``"module:attr"`` string names (imported now); anything else is returned as it is."""
    if not isinstance(target, str):
        return target
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


class Registry(Mapping[str, T]):
    """Entries by name, in registration order (``sort=True``: names listed sorted).

    ``kind`` names what is registered in the errors: ``unknown <kind> 'x'; did you mean 'y'? choose
    one of [...]``.
    """

    def __init__(self, kind: str, entries: Mapping[str, T] | None = None, *, sort: bool = False):
        self.kind = kind
        self.sort = sort
        self._entries: dict[str, T] = {}
        for name, entry in (entries or {}).items():
            self.register(name, entry)

    def register(self, name: str, entry: T) -> None:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry

    def names(self) -> list[str]:
        return sorted(self._entries) if self.sort else list(self._entries)

    def unknown(self, name: str) -> str:
        """The error message for ``name``, which is not registered."""
        guess = closest_key(str(name), self._entries)
        hint = f"did you mean {guess!r}? " if guess is not None else ""
        return f"unknown {self.kind} {name!r}; {hint}choose one of {self.names()}"

    def lookup(self, name: str) -> T:
        """The entry of ``name``; ``ValueError`` (:meth:`unknown`) if there is none."""
        if name not in self._entries:
            raise ValueError(self.unknown(name))
        return self._entries[name]

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
