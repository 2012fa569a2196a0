"""Byte units, in their own module because every part of the budget needs them: the limits and
the file-size caps are written in them (`shapes`, `tokens`, `memory`) and `report` prints in
them. (A module of its own keeps the others from importing one another just for a constant.)"""

from __future__ import annotations

GIB = 1 << 30
MIB = 1 << 20
