"""The seed lists every verb and benchmark takes: `1,2,3` or a range `1-5` (both ends included)."""
from __future__ import annotations

# The simulator's seed space (sim_bridge/envs.py SEED_SPACE, `samm sim run --seed`): a larger seed
# overflowed the int64 the seeds are passed in, a traceback after the run had started.
MAX_SEED = 2**62 - 1
# Far more episodes than any run takes; "1-10000000000" tried to build a list of 10^10 ints.
MAX_SEEDS = 100_000


class SeedsOutOfBounds(ValueError):
    """A well-formed seed list the runs cannot take (too many seeds, one outside the seed space, or
    one given twice)."""


def parse_seeds(text: str) -> list[int]:
    """`"1-5"` -> [1, 2, 3, 4, 5]; `"1,3"` -> [1, 3]. Raises ValueError on anything else."""
    if "-" in text and "," not in text:
        a, b = text.split("-")
        low, high = int(a), int(b)
        if high - low + 1 > MAX_SEEDS:
            raise SeedsOutOfBounds(f"{text!r} is {high - low + 1} seeds; at most {MAX_SEEDS}")
        seeds = list(range(low, high + 1))
    else:
        seeds = [int(x) for x in text.split(",")]  # an empty item ("1,,2", "") is a typo, not a skip
    if not seeds:  # "5-1": a run over no episodes would report statistics of nothing
        raise ValueError(f"no seeds in {text!r}")
    if len(seeds) > MAX_SEEDS:
        raise SeedsOutOfBounds(f"{text!r} is {len(seeds)} seeds; at most {MAX_SEEDS}")
    outside = [s for s in seeds if not 0 <= s <= MAX_SEED]
    if outside:
        raise SeedsOutOfBounds(f"seed {outside[0]} is outside 0..{MAX_SEED}")
    from agents.report import refuse_repeats  # "1,1" ran one seed twice: n = 2 with a std of 0

    try:
        refuse_repeats(seeds, repr(text))
    except ValueError as exc:
        raise SeedsOutOfBounds(str(exc)) from None
    return seeds


def require_disjoint(evaluated, evaluated_flag: str, selected, selected_flag: str) -> None:
    """ValueError naming the shared seeds when the seeds a method is reported on are also seeds it
    was tuned or selected on: its figure would be measured on its own tuning data."""
    shared = sorted(set(int(s) for s in evaluated) & set(int(s) for s in selected))
    if shared:
        shown = ", ".join(map(str, shared[:5])) + (", ..." if len(shared) > 5 else "")
        raise ValueError(f"{evaluated_flag} and {selected_flag} share seed(s) {shown}: the evaluation seeds "
                         f"must be apart from the tuning/validation ones")


#: the seeds the microservice experiment reports on (`samm experiment reclaimer`: 1-5) and its check
#: seeds (6-10): a checkpoint or a ceiling chosen on them is reported on its own selection episodes
REPORTED_SEEDS = range(1, 11)


def require_apart_from_reported(seeds, flag: str) -> None:
    """ValueError naming `flag` when any of `seeds` (chosen on: validation, tuning) is one of
    REPORTED_SEEDS; the one rule of `samm reclaimer-ceiling`, its module and `samm train`."""
    shared = sorted(set(int(s) for s in seeds) & set(REPORTED_SEEDS))
    if shared:
        raise ValueError(f"{flag} holds seed(s) {', '.join(map(str, shared))} of the experiment's seeds 1-5 and "
                         f"check seeds 6-10: what is chosen on them would be reported on the episodes it was "
                         f"chosen on (use e.g. 101-120)")
