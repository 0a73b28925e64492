"""Command line: python3 -m todo {add,list,done} ..."""

import argparse
import sys

from todo import store
from todo.fmt import format_item


def parser():
    p = argparse.ArgumentParser(prog="todo")
    sub = p.add_subparsers(dest="command", required=True)
    add = sub.add_parser("add", help="add an item")
    add.add_argument("title")
    add.add_argument("--priority", choices=store.PRIORITIES, default="normal")
    sub.add_parser("list", help="list the items")
    done = sub.add_parser("done", help="mark an item done")
    done.add_argument("id", type=int)
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    items = store.load()
    if args.command == "add":
        print(format_item(store.add(items, args.title, args.priority)))
        store.save(items)
    elif args.command == "list":
        for item in items:
            print(format_item(item))
    elif args.command == "done":
        try:
            print(format_item(store.mark_done(items, args.id)))
        except KeyError:
            print(f"no item {args.id}", file=sys.stderr)
            return 1
        store.save(items)
    return 0
