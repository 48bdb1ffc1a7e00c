"""Cost models: FLOP/byte counts from shapes (``flops``), the roofline-with-efficiency ``CostModel`` (``model``),
the named cost terms a price is made of (``terms``), Profiles (``profile``). The package imports none of them, so
that ``python -m rlhfsim.costs.terms`` runs its module once."""
