"""A rank's memory budget that remembers the questions it answered.

SlimPack's phase 1 after the merge planner (the joint LPT and the local search) reads its
memory budget only to ask "do these bytes fit, less that reserve?". Its result is therefore the
same for every budget that gives the same answers to the questions it asked, which lets a
lockstep solve reuse one phase 1 for the candidate pack counts whose merge plans agree even
though their budgets differ slightly (each count reserves room for the packs in flight).

Example: a budget of 10 bytes asked ``fits(7)`` (7 <= 10: yes) and ``fits(6, reserve=3)``
(6 <= 7: yes); a budget of 9 answers both alike (7 <= 9, 6 <= 6), one of 8.5 does not
(6 > 5.5).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["MemoryBudget"]


@dataclass
class MemoryBudget:
    """``nbytes`` a rank may hold; :meth:`fits` answers and records every question."""

    nbytes: float
    asked: list[tuple[float, float, bool]] = field(default_factory=list)
    """``(need, reserve, answer)`` per question, in the order asked."""

    def fits(self, need: float, reserve: float = 0.0) -> bool:
        """Do ``need`` bytes fit the budget less ``reserve`` bytes?"""
        answer = need <= self.nbytes - reserve
        self.asked.append((need, reserve, answer))
        return answer

    def answers_alike(self, nbytes: float) -> bool:
        """Would a budget of ``nbytes`` have answered every question asked so far the same
        way (the same float operations: ``need <= nbytes - reserve``)?"""
        return all((need <= nbytes - reserve) == answer for need, reserve, answer in self.asked)
