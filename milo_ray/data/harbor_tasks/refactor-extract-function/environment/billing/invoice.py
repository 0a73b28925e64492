"""Invoice and quote totals (VAT 20 %, tier discounts)."""

VAT = 0.2


def invoice_total(lines, customer_tier):
    """Total of an invoice: discounted subtotal plus VAT, rounded to cents."""
    subtotal = 0
    for line in lines:
        subtotal += line["qty"] * line["unit_price"]
    if customer_tier == "gold":
        rate = 0.15
    elif customer_tier == "silver":
        rate = 0.05
    else:
        rate = 0.0
    discounted = subtotal - subtotal * rate
    return round(discounted * (1 + VAT), 2)


def quote_total(lines, customer_tier, shipping):
    """Total of a quote: like an invoice, plus shipping (not taxed), rounded to cents."""
    subtotal = 0
    for line in lines:
        subtotal += line["qty"] * line["unit_price"]
    if customer_tier == "gold":
        rate = 0.15
    elif customer_tier == "silver":
        rate = 0.05
    else:
        rate = 0.0
    discounted = subtotal - subtotal * rate
    return round(discounted * (1 + VAT) + shipping, 2)
