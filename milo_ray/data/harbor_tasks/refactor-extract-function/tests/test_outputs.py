import ast
import random
import subprocess
import sys
import unittest
from pathlib import Path

sys.path.insert(0, "/app")
from billing import invoice  # noqa: E402

SOURCE = Path("/app/billing/invoice.py")


def old_discounted(lines, tier):
    subtotal = 0
    for line in lines:
        subtotal += line["qty"] * line["unit_price"]
    rate = {"gold": 0.15, "silver": 0.05}.get(tier, 0.0)
    return subtotal - subtotal * rate


def cases():
    rng = random.Random(11)
    for _ in range(300):
        lines = [{"qty": rng.randint(0, 9), "unit_price": rng.choice([0.99, 1.5, 9.99, 12.0, 19.95, 100])}
                 for _ in range(rng.randint(0, 6))]
        yield lines, rng.choice(["gold", "silver", "regular", "bronze", ""]), rng.choice([0, 4.99, 12.5])


def function(name):
    for node in ast.parse(SOURCE.read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError(f"no module-level function {name}")


class TestBehaviour(unittest.TestCase):
    def test_invoice_total_unchanged(self):
        for lines, tier, _ in cases():
            self.assertEqual(invoice.invoice_total(lines, tier), round(old_discounted(lines, tier) * 1.2, 2))

    def test_quote_total_unchanged(self):
        for lines, tier, shipping in cases():
            self.assertEqual(invoice.quote_total(lines, tier, shipping),
                             round(old_discounted(lines, tier) * 1.2 + shipping, 2))

    def test_discounted_subtotal(self):
        for lines, tier, _ in cases():
            self.assertEqual(invoice.discounted_subtotal(lines, tier), old_discounted(lines, tier))

    def test_tier_rates(self):
        self.assertEqual(invoice.TIER_RATES, {"gold": 0.15, "silver": 0.05})

    def test_own_tests_pass(self):
        proc = subprocess.run([sys.executable, "-m", "unittest", "tests.test_invoice"], cwd="/app",
                              capture_output=True, text=True)
        self.assertEqual(proc.returncode, 0, proc.stderr[-1500:])


class TestStructure(unittest.TestCase):
    def test_totals_call_discounted_subtotal(self):
        for name in ("invoice_total", "quote_total"):
            calls = {n.func.id for n in ast.walk(function(name)) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
            self.assertIn("discounted_subtotal", calls, name)

    def test_totals_have_no_loops_or_tier_comparisons(self):
        for name in ("invoice_total", "quote_total"):
            nodes = list(ast.walk(function(name)))
            self.assertFalse([n for n in nodes if isinstance(n, (ast.For, ast.While, ast.comprehension))], name)
            self.assertFalse([n for n in nodes if isinstance(n, ast.Compare)
                              and "customer_tier" in {x.id for x in ast.walk(n) if isinstance(x, ast.Name)}], name)

    def test_discounted_subtotal_uses_tier_rates(self):
        names = {n.id for n in ast.walk(function("discounted_subtotal")) if isinstance(n, ast.Name)}
        self.assertIn("TIER_RATES", names)


if __name__ == "__main__":
    unittest.main()
