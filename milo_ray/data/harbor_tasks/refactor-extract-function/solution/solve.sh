#!/bin/bash
set -euo pipefail
cat > /app/billing/invoice.py <<'PY'
"""Invoice and quote totals (VAT 20 %, tier discounts)."""

VAT = 0.2
# Discount rate per customer tier; other tiers get none.
TIER_RATES = {"gold": 0.15, "silver": 0.05}


def discounted_subtotal(lines, customer_tier):
    """Sum of qty * unit_price over `lines`, minus the tier's discount (unrounded)."""
    subtotal = 0
    for line in lines:
        subtotal += line["qty"] * line["unit_price"]
    rate = TIER_RATES.get(customer_tier, 0.0)
    return subtotal - subtotal * rate


def invoice_total(lines, customer_tier):
    """Total of an invoice: discounted subtotal plus VAT, rounded to cents."""
    return round(discounted_subtotal(lines, customer_tier) * (1 + VAT), 2)


def quote_total(lines, customer_tier, shipping):
    """Total of a quote: like an invoice, plus shipping (not taxed), rounded to cents."""
    return round(discounted_subtotal(lines, customer_tier) * (1 + VAT) + shipping, 2)
PY
