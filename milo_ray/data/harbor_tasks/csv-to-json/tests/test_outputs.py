import json
import unittest
from pathlib import Path

OUT = Path("/app/output")
EXPECTED = [
    {"id": 1, "name": "Ada Lovelace", "department": "Engineering", "salary": 120000, "start_date": "2019-03-01", "manager_id": None},
    {"id": 2, "name": "Hopper, Grace", "department": "Engineering", "salary": 135000, "start_date": "2017-07-15", "manager_id": 1},
    {"id": 3, "name": "Alan Turing", "department": "Research", "salary": 128500, "start_date": "2018-01-10", "manager_id": 1},
    {"id": 4, "name": "Katherine Johnson", "department": "Research", "salary": 99000, "start_date": "2020-11-02", "manager_id": 3},
    {"id": 5, "name": "Linus Torvalds", "department": "Operations", "salary": 87000, "start_date": "2021-05-20", "manager_id": 2},
    {"id": 6, "name": "Margaret Hamilton", "department": "Engineering", "salary": 142000, "start_date": "2016-09-30", "manager_id": None},
    {"id": 7, "name": "Edsger Dijkstra", "department": "Research", "salary": None, "start_date": "2022-02-14", "manager_id": 3},
]


def employees():
    return json.loads((OUT / "employees.json").read_text())


class TestEmployees(unittest.TestCase):
    def test_is_array_of_objects_in_file_order(self):
        rows = employees()
        self.assertIsInstance(rows, list)
        self.assertEqual([r["id"] for r in rows], [1, 2, 3, 4, 5, 6, 7])

    def test_keys_are_header_columns(self):
        for row in employees():
            self.assertEqual(set(row), {"id", "name", "department", "salary", "start_date", "manager_id"})

    def test_integer_columns(self):
        rows = employees()
        self.assertEqual([type(r["salary"]) for r in rows[:6]], [int] * 6)
        self.assertEqual(rows[3]["manager_id"], 3)

    def test_empty_cells_are_null(self):
        rows = employees()
        self.assertIsNone(rows[0]["manager_id"])
        self.assertIsNone(rows[5]["manager_id"])
        self.assertIsNone(rows[6]["salary"])

    def test_quoted_field_with_comma(self):
        self.assertEqual(employees()[1]["name"], "Hopper, Grace")

    def test_exact_records(self):
        self.assertEqual(employees(), EXPECTED)

    def test_by_department(self):
        got = json.loads((OUT / "by_department.json").read_text())
        self.assertEqual(got, {
            "Engineering": ["Ada Lovelace", "Hopper, Grace", "Margaret Hamilton"],
            "Operations": ["Linus Torvalds"],
            "Research": ["Alan Turing", "Edsger Dijkstra", "Katherine Johnson"],
        })

    def test_input_unchanged(self):
        self.assertTrue(Path("/app/data/employees.csv").read_text().startswith("id,name,department,salary"))
        self.assertEqual(len(Path("/app/data/employees.csv").read_text().splitlines()), 8)


if __name__ == "__main__":
    unittest.main()
