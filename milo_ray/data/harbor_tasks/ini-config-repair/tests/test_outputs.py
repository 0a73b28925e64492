import configparser
import json
import re
import unittest
from pathlib import Path

INI = Path("/app/config/service.ini")
EXPECTED = {
    "server": {"host": "0.0.0.0", "port": 8080, "workers": 6, "debug": False},
    "database": {"url": "postgres://db.internal:5432/app", "pool_size": 10, "timeout": 30},
    "logging": {"level": "INFO", "format": "%(asctime)s %(levelname)s %(message)s", "file": "/var/log/service.log"},
    "features": {"beta_banner": True, "max_upload_mb": 25},
}


def parsed():
    parser = configparser.ConfigParser()
    parser.read_string(INI.read_text())
    return parser


class TestIni(unittest.TestCase):
    def test_parses_strictly(self):
        self.assertEqual(parsed().sections(), ["server", "database", "logging", "features"])

    def test_last_value_wins_and_sections_merge(self):
        server = parsed()["server"]
        self.assertEqual((server["host"], server["port"], server["workers"], server["debug"]),
                         ("0.0.0.0", "8080", "6", "false"))

    def test_bare_option_gets_default(self):
        self.assertEqual(parsed()["database"]["timeout"], "30")

    def test_percent_values_verbatim(self):
        self.assertEqual(parsed().get("logging", "format"), "%(asctime)s %(levelname)s %(message)s")

    def test_equals_syntax_only(self):
        options = [line for line in INI.read_text().splitlines()
                   if line.strip() and not line.lstrip().startswith(("#", ";", "["))]
        self.assertEqual([line for line in options if not re.fullmatch(r"\w+ = \S.*", line)], [])

    def test_nothing_added_or_removed(self):
        got = {s: set(parsed()[s]) for s in parsed().sections()}
        self.assertEqual(got, {s: set(v) for s, v in EXPECTED.items()})

    def test_json_export(self):
        self.assertEqual(json.loads(Path("/app/config/service.json").read_text()), EXPECTED)


if __name__ == "__main__":
    unittest.main()
