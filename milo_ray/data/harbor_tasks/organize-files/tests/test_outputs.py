import json
import unittest
from pathlib import Path

SORTED = Path("/app/sorted")
EXPECTED = {
    "images": ["diagram.png", "holiday photo.jpeg", "logo.GIF", "photo1.JPG"],
    "documents": ["README.md", "notes.txt", "report.PDF"],
    "data": ["config.json", "data.CSV"],
    "code": ["deploy.sh", "script.py"],
    "other": ["Makefile", "archive.tar.gz", "song.mp3"],
}


def names(category):
    folder = SORTED / category
    return sorted(p.name for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []


class TestOrganize(unittest.TestCase):
    def test_inbox_empty(self):
        inbox = Path("/app/inbox")
        self.assertEqual([p.name for p in inbox.rglob("*") if p.is_file()] if inbox.exists() else [], [])

    def test_images(self):
        self.assertEqual(names("images"), EXPECTED["images"])

    def test_documents_and_data(self):
        self.assertEqual((names("documents"), names("data")), (EXPECTED["documents"], EXPECTED["data"]))

    def test_code(self):
        self.assertEqual(names("code"), EXPECTED["code"])

    def test_other_including_no_extension(self):
        self.assertEqual(names("other"), EXPECTED["other"])

    def test_contents_unchanged(self):
        files = [p for p in SORTED.rglob("*") if p.is_file() and p.name != "index.json"]
        self.assertEqual(len(files), 14)
        for p in files:
            self.assertEqual(p.read_text(), f"# content of {p.name}\n")

    def test_index(self):
        self.assertEqual(json.loads((SORTED / "index.json").read_text()), EXPECTED)


if __name__ == "__main__":
    unittest.main()
