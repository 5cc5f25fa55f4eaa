"""Run the fabric controller: python -m controller --plan PLAN.json --ready-file F --ofp-port N.

os-ken 4 ships no manager command, so this sets os_ken.cfg.CONF and calls
AppManager.run_apps itself. SIGTERM stops it cleanly (exit status 0).

It runs os-ken on its eventlet hub, as the removed osken-manager did: under os-ken 4's default
"native" hub, run_apps cannot stop (its cleanup calls HubThread.kill, which does not exist, and
its threads cannot be interrupted).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import warnings

from controller.core import uplink_builder
from fabric_emu.lb import spray


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m controller", description=__doc__.splitlines()[0])
    p.add_argument("--plan", required=True, help="plan JSON (FabricPlan.to_json())")
    p.add_argument("--ready-file", required=True, help="written once every switch is programmed")
    p.add_argument("--ofp-port", type=int, required=True, help="OpenFlow TCP port to listen on")
    p.add_argument("--listen", default="127.0.0.1", help="address to listen on")
    p.add_argument("--lb-mode", default="ecmp", help="ecmp | spray | dlb")
    p.add_argument("--spray-entropies", type=int, default=0,
                   help="spray: UDP source ports per QP (a power of two; 0: one per uplink)")
    p.add_argument("--rest-port", type=int, default=0,
                   help="serve the REST API (GET/PUT /lb) on this port of --listen (0: none)")
    p.add_argument("--bpf-pins", default="", help="the run's pinned BPF objects (the DLB stage's table)")
    p.add_argument("--dlb-inactivity-ns", type=int, default=100_000_000, help="DLB flowlet gap, wall ns")
    p.add_argument("--dlb-window-ns", type=int, default=40_000_000, help="DLB quality window, wall ns")
    p.add_argument("--log", help="log file (default: stderr)")
    args = p.parse_args(argv)
    try:
        uplink_builder(args.lb_mode)
        if args.spray_entropies:
            spray.entropy_ports(0, args.spray_entropies)  # checks it
    except ValueError as e:
        p.error(str(e))
    return args


def close_apps_on_signal() -> None:
    """SIGTERM or SIGINT closes the apps, so that run_apps returns through its own cleanup.

    A handler must not raise: it would raise in whichever green thread was running, where
    os-ken's hub logs and swallows it. Nor may it write with eventlet's patched os.write, which
    refuses to run inside the hub. So Python's own wakeup fd writes to a pipe (at C level), the
    handler does nothing, and a green thread waiting on the pipe does the work.
    """
    from eventlet.green import os as green_os
    from os_ken.base.app_manager import AppManager
    from os_ken.lib import hub

    read_end, write_end = os.pipe2(os.O_NONBLOCK)
    signal.set_wakeup_fd(write_end)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: None)

    def close_when_signalled() -> None:
        green_os.read(read_end, 1)
        logging.getLogger("fabric_emu.controller").info("signal received: stopping")
        AppManager.get_instance().close()

    hub.spawn(close_when_signalled)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(filename=args.log, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ["OSKEN_HUB_TYPE"] = "eventlet"  # read when os_ken.lib.hub is first imported
    warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated")
    from os_ken.lib import hub

    hub.patch(thread=False)
    from os_ken import cfg
    from os_ken.base.app_manager import AppManager

    import controller.app  # noqa: F401  registers the [fabric] options before CONF is parsed

    # No config files: everything comes from this command line.
    cfg.CONF(args=[], project="os_ken", default_config_files=[])
    cfg.CONF.set_override("ofp_listen_host", args.listen)
    cfg.CONF.set_override("ofp_tcp_listen_port", args.ofp_port)
    cfg.CONF.set_override("plan", args.plan, group="fabric")
    cfg.CONF.set_override("ready_file", args.ready_file, group="fabric")
    cfg.CONF.set_override("lb_mode", args.lb_mode, group="fabric")
    cfg.CONF.set_override("spray_entropies", args.spray_entropies, group="fabric")
    cfg.CONF.set_override("rest_port", args.rest_port, group="fabric")
    cfg.CONF.set_override("rest_host", args.listen, group="fabric")
    cfg.CONF.set_override("bpf_pins", args.bpf_pins, group="fabric")
    cfg.CONF.set_override("dlb_inactivity_ns", args.dlb_inactivity_ns, group="fabric")
    cfg.CONF.set_override("dlb_window_ns", args.dlb_window_ns, group="fabric")

    close_apps_on_signal()
    log = logging.getLogger("fabric_emu.controller")
    log.info("listening on %s:%d", args.listen, args.ofp_port)
    AppManager.run_apps(["controller.app"])
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
