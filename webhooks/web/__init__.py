"""The HTTP face: one blueprint module per area (leads, payments, admin/, ops/), the shared
plumbing in http.py. Views read reject, verify, dedupe, act, answer; the logic is below."""
