"""`ablate data fetch | verify | list`: the data root against the catalogue of public sources and the manifest.

May import: every stage; turns arguments into calls (ablate.data.fetch, ablate.data.catalog,
ablate.launch.data_needs) and results into lines.
"""

from __future__ import annotations

import sys
from pathlib import Path

EXIT_OK, EXIT_BAD_INPUT = 0, 2


def _root(args) -> Path:
    from ablate.config.paths import data_root

    return data_root(args.data_root).absolute()


def _datasets(targets):
    from ablate.data.catalog import catalog
    from ablate.launch.data_needs import target_datasets

    if not targets:
        return list(catalog().values())
    chosen = {}
    for target in targets:
        chosen.update((ds.name, ds) for ds in target_datasets(target))
    return list(chosen.values())


def cmd_data_fetch(args) -> int:
    from ablate.data.download import mirror_of
    from ablate.data.fetch import fetch_datasets

    if not args.targets:
        from ablate.config.errors import SpecError
        from ablate.launch.data_needs import TARGETS

        raise SpecError(
            "name what to fetch", key="target", allowed=f"{TARGETS} (`ablate data list`: the datasets)"
        )
    datasets, root = _datasets(args.targets), _root(args)
    print(f"fetching {len(datasets)} datasets into {root}: {', '.join(ds.name for ds in datasets)}")
    fetched = fetch_datasets(datasets, root, mirror_of(args.mirror))
    print(f"done: {len(fetched)} fetched, {len(datasets) - len(fetched)} already in place; data root {root}")
    return EXIT_OK


def cmd_data_verify(args) -> int:
    """Named datasets: every file checked. None named: each catalogued dataset with a folder in the data root
    (the others are listed as not fetched). A data root that is not there, or that holds none of them, is exit
    2: never "matches" over nothing."""
    from ablate.config.errors import SpecError
    from ablate.data.catalog import dataset_problems, unverified_reason

    root = _root(args)
    if not root.is_dir():
        raise SpecError(
            f"the data root {root} is not a folder ({'not there' if not root.exists() else 'a file'}); "
            "`ablate data fetch TARGET` makes it, or name another with --data-root / $ABLATE_DATA_ROOT",
            key="data root",
        )
    bad, unverified, checked = 0, [], 0
    for ds in _datasets(args.targets):
        folder = root / ds.name
        if not args.targets and not folder.is_dir():
            print(f"{ds.name}: not fetched")
            continue
        checked += 1
        problems = dataset_problems(folder, ds)
        bad += bool(problems)
        reason = unverified_reason(ds)
        if reason and not problems:  # the files are the ones its fetch wrote; nothing says they are the paper's
            unverified.append(ds.name)
            print(f"{ds.name}: ok, UNVERIFIED source: {reason}")
        else:
            print(f"{ds.name}: " + ("ok" if not problems else "MISMATCH: " + "; ".join(problems)))
    if unverified:
        print(
            f"{len(unverified)} datasets come from unverified downloads ({', '.join(unverified)}): their files "
            "are those their fetch wrote, but no pinned checksum says they are the files the paper used; "
            "`ablate report --html` marks the scores computed on them"
        )
    if bad:
        print(
            f"error: {bad} datasets in {root} differ from the manifest (`ablate data fetch NAME` replaces them)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    if not checked:
        print(
            f"error: no catalogued dataset is fetched in {root}: nothing was checked "
            "(`ablate data fetch TARGET` fetches them; `ablate data list` lists them)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    print(f"every checked dataset in {root} matches the manifest ({checked} checked)")
    return EXIT_OK


def cmd_data_list(args) -> int:
    from ablate.data.catalog import catalog, origin

    root = _root(args)
    for ds in catalog().values():
        size = sum(e.size for e in ds.files) / 1e6
        state = "here" if (root / ds.name).is_dir() else "-"
        print(
            f"{ds.name:24} {size:7.2f} MB  {state:4}  {'NON-COMMERCIAL ' if ds.non_commercial else ''}"
            f"{ds.licence}  [{origin(ds)}{'' if ds.converter else ', no converter yet'}]"
        )
    return EXIT_OK


def add_data_commands(sub) -> None:
    from ablate.config.paths import given_or_shipped

    d = sub.add_parser("data", help="the data root: fetch datasets from their public sources, verify them")
    where = d.add_subparsers(dest="data_command", required=True)
    root = _data_root_option()
    f = where.add_parser("fetch", parents=[root], help="download, derive and check datasets into the data root")
    f.add_argument(
        "targets",
        nargs="*",
        type=given_or_shipped,
        metavar="TARGET",
        help="a dataset, a set of datasets (tests: what the "
        "test suite reads), a task, suite:NAME, or a grid / run spec file: the datasets it reads",
    )
    f.add_argument(
        "--mirror",
        metavar="URL",
        help="a mirror of the sources laid out as <URL>/<owner>/<repo>/<commit>"
        "/<path> (default: $ABLATE_DATA_MIRROR, else GitHub)",
    )
    f.set_defaults(func=cmd_data_fetch)
    v = where.add_parser(
        "verify",
        parents=[root],
        help="check the data root against the manifest (exit 2 on a missing file or a size / sha256 mismatch)",
    )
    v.add_argument(
        "targets",
        nargs="*",
        type=given_or_shipped,
        metavar="TARGET",
        help="as fetch (default: every dataset present)",
    )
    v.set_defaults(func=cmd_data_verify)
    ls = where.add_parser("list", parents=[root], help="the catalogued datasets: size, licence, source")
    ls.set_defaults(func=cmd_data_list)


def _data_root_option():
    import argparse

    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--data-root", help="the data root (default: $ABLATE_DATA_ROOT or ./data)")
    return p
