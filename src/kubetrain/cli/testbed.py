"""`kubetrain testbed build | up | down | status | env | nodes`."""

from __future__ import annotations

import argparse
import json
import os
import shlex

from kubetrain.testbed import build as build_mod
from kubetrain.testbed import kueue_build, state_root
from kubetrain.testbed.cluster import Testbed, TestbedError, node_table


def _testbed(args: argparse.Namespace) -> Testbed:
    return Testbed(args.state_dir or state_root() / args.name)


def _build(args: argparse.Namespace) -> int:
    binaries = build_mod.build(force=args.force, log=not args.print_dir)
    if not args.without_kueue:
        kueue = kueue_build.build(force=args.force, log=not args.print_dir)
    if args.print_dir:
        print(binaries.directory)
        if not args.without_kueue:
            print(kueue.directory)
    return 0


def _up(args: argparse.Namespace) -> int:
    testbed = Testbed.up(
        args.state_dir or state_root() / args.name,
        pool=args.pool,
        apiserver_port=args.apiserver_port,
        timeout=args.timeout,
        kueue=args.kueue,
        in_cluster=args.in_cluster,
    )
    status = testbed.status()
    print(
        f"testbed {args.name} is up in {status['ready_seconds']} s "
        f"(pool {status['pool']}, {status['server']})"
    )
    print(f"export KUBECONFIG={shlex.quote(str(testbed.kubeconfig))}")
    if url := testbed.kubetrain_env().get("KUBETRAIN_URL"):
        # The token is printed by `testbed env` only, when asked for.
        which = f"--state-dir {args.state_dir}" if args.state_dir else f"--name {args.name}"
        print(f'kubetrain runs in the cluster at {url}: eval "$(kubetrain testbed env {which})"')
    return 0


def _down(args: argparse.Namespace) -> int:
    testbed = _testbed(args)
    if not testbed.state_file.exists():
        print(f"no testbed in {testbed.state_dir}")
        return 0
    stopped = testbed.down(keep_state=args.keep)
    print(f"stopped {', '.join(stopped) or 'nothing (none was running)'}")
    return 0


def _status(args: argparse.Namespace) -> int:
    testbed = _testbed(args)
    if not testbed.state_file.exists():
        print(f"no testbed in {testbed.state_dir}")
        return 3
    status = testbed.status()
    print(json.dumps(status, indent=2) if os.environ.get("KUBETRAIN_JSON") else _table(status))
    return 0 if all(c["running"] for c in status["components"].values()) else 3


def _table(status: dict[str, object]) -> str:
    lines = [
        f"testbed {status['state_dir']}  pool={status['pool']}  server={status['server']}",
        f"  apiserver ready: {status['apiserver_ready']}",
    ]
    components = status["components"]
    assert isinstance(components, dict)
    for name, info in components.items():
        mark = "running" if info["running"] else "stopped"
        lines.append(f"  {name:<24} pid {info['pid'] or '-':<8} {mark}")
    return "\n".join(lines)


def _env(args: argparse.Namespace) -> int:
    testbed = _testbed(args)
    if not testbed.state_file.exists():
        raise TestbedError(f"no testbed in {testbed.state_dir} (run `kubetrain testbed up`)")
    print(f"export KUBECONFIG={shlex.quote(str(testbed.kubeconfig))}")
    for name, value in testbed.kubetrain_env().items():
        print(f"export {name}={shlex.quote(value)}")
    return 0


def _nodes(args: argparse.Namespace) -> int:
    print(node_table(_testbed(args)))
    return 0
