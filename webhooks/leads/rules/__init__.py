"""Who sells, who buys and what a lead must be: the publishers' and buyers' rules, and their per-
process cache."""
