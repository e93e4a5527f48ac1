#!/usr/bin/env python3
"""Two paged_moe_bench binaries as an A/B: one process of each, run one after the other on the same GPU, merged
into one file in which the second binary's configurations are named `<name>-new`, so that compare.py reads
them like configurations measured in one process (pair the files process by process).

  python3 benchmarks/device/merge_ab.py OLD.json NEW.json OUT.json
  e.g. for i in 1 2 3; do merge_ab.py old_$i.json new_$i.json ab_$i.json; done
       compare.py default default-new ab_*.json
"""
import json
import sys


def main(old_path, new_path, out_path):
    old, new = json.load(open(old_path)), json.load(open(new_path))
    cases = {(c["model"], c["tokens"]): c for c in old["cases"]}
    for c in new["cases"]:
        o = cases.get((c["model"], c["tokens"]))
        if o is None:
            continue
        for x in c["configs"]:
            o["configs"].append(dict(x, config=x["config"] + "-new"))
    json.dump(old, open(out_path, "w"))


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
