"""The secrets and admin token of the test runs and the benchmarks (never a real one)."""

from __future__ import annotations

ADMIN_TOKEN = "test-admin-token-0123456789"
SECRETS = {
    "PAYSTACK_SECRET_KEY": "sk_test_paystack_secret",
    "FLUTTERWAVE_SECRET_HASH": "flw-secret-hash-of-the-tests",  # >= 16 characters (config.py)
    "MONNIFY_CLIENT_SECRET": "monnify-client-secret",
    "INTERSWITCH_SECRET": "interswitch-secret",
    "STRIPE_WEBHOOK_SECRET": "whsec_stripe_test_secret",
    "STANDARD_WEBHOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
}
# Every provider API the runs could reach, on a closed port of this machine: a stack started
# with SECRETS set would otherwise reconcile with the providers' real APIs (PAYSTACK_SECRET_KEY is
# also Paystack's API key). Tests of reconciliation point one at testkit/provider_apis.py.
NO_PROVIDER_APIS = {
    "PAYSTACK_API_BASE": "http://127.0.0.1:9",
    "FLUTTERWAVE_API_BASE": "http://127.0.0.1:9",
    "MONNIFY_API_BASE": "http://127.0.0.1:9",
    "STRIPE_API_BASE": "http://127.0.0.1:9",
}
# The runs' partners (buyers, event receivers, provider stand-ins) listen on 127.0.0.1, which a
# deployment's outbound calls never reach without this (docs/security.md).
LOOPBACK_PARTNERS = {"OUTBOUND_ALLOW_LOOPBACK": "1"}
