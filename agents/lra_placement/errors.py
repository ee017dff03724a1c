class Infeasible(RuntimeError):
    """No placement satisfies the slots and rules."""
