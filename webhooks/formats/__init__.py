"""The forms values take at Floodgate's edges: strict JSON, money in minor units, a consumer's
one key, the fields' validators, and CSV cells a spreadsheet cannot run."""
