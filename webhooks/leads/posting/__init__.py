"""How a lead is put to a buyer: its post and ping templates, what they may cost, and the call."""
