import json
import unittest
from pathlib import Path


def report():
    return json.loads(Path("/app/report.json").read_text())


class TestReport(unittest.TestCase):
    def test_exact_keys(self):
        self.assertEqual(set(report()), {"total_requests", "malformed_lines", "unique_ips", "methods", "status_counts",
                                         "bytes_total", "error_rate", "top_paths", "busiest_hour"})

    def test_line_counts(self):
        r = report()
        self.assertEqual((r["total_requests"], r["malformed_lines"]), (240, 6))

    def test_unique_ips(self):
        self.assertEqual(report()["unique_ips"], 25)

    def test_methods(self):
        self.assertEqual(report()["methods"], {"GET": 143, "POST": 31, "PUT": 22, "HEAD": 24, "DELETE": 20})

    def test_status_counts(self):
        self.assertEqual(report()["status_counts"], {
            "200": 125, "201": 8, "204": 6, "301": 11, "304": 11, "400": 12, "401": 7, "403": 10,
            "404": 24, "500": 7, "502": 14, "503": 5})

    def test_bytes_total(self):
        self.assertEqual(report()["bytes_total"], 5714496)

    def test_error_rate(self):
        self.assertEqual(report()["error_rate"], 0.3292)

    def test_top_paths(self):
        self.assertEqual(report()["top_paths"], [
            {"path": "/api/items", "count": 55}, {"path": "/admin", "count": 30},
            {"path": "/static/style.css", "count": 23}, {"path": "/", "count": 22},
            {"path": "/index.html", "count": 21}])

    def test_busiest_hour(self):
        self.assertEqual(report()["busiest_hour"], "2024-03-12T09")


if __name__ == "__main__":
    unittest.main()
