import unittest

from billing.invoice import invoice_total, quote_total

LINES = [{"qty": 2, "unit_price": 10.0}, {"qty": 1, "unit_price": 5.5}]


class TestInvoice(unittest.TestCase):
    def test_invoice_gold(self):
        self.assertEqual(invoice_total(LINES, "gold"), 26.01)

    def test_quote_regular(self):
        self.assertEqual(quote_total(LINES, "regular", 4.99), 35.59)


if __name__ == "__main__":
    unittest.main()
