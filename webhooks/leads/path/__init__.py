"""The lead path: a posted lead from intake to its answer and its settlement item, and the two
ways a lead whose routing died is taken up again."""
