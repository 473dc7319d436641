"""Serve one verifiers environment for arlo (env.kind: verifiers, launch: embedded).

arlo starts this with the project's Python as a supervised child:

    python python/arlo_verifiers_server.py --address tcp://127.0.0.1:PORT \
        --env '{"taskset": {"id": "my_env", ...}}' [--max-concurrent N] [--path DIR]...

It builds verifiers' EnvConfig from --env (the environment id and its arguments), loads the
environment and serves it with verifiers' own EnvServer (a ZeroMQ ROUTER speaking msgpack:
run, cancel, health) until SIGTERM. --path entries go on sys.path first, so an environment
module that is not installed (arlo's tests/verifiers_envs) can be loaded by its module name.
"""

import argparse
import asyncio
import json
import os
import signal
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--env", required=True, help="verifiers EnvConfig as JSON")
    parser.add_argument("--max-concurrent", type=int, default=0)
    parser.add_argument("--path", action="append", default=[])
    args = parser.parse_args()
    # Absolute: the tool servers verifiers starts run in a directory of their own.
    args.path = [os.path.abspath(p) for p in args.path]
    for p in reversed(args.path):
        sys.path.insert(0, p)
    if args.path:  # the programs the environment starts (tool servers: python -m <module>) as well
        os.environ["PYTHONPATH"] = os.pathsep.join(args.path + [os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)

    from verifiers.v1.configs.env import EnvConfig
    from verifiers.v1.env import Env
    from verifiers.v1.serve.server import EnvServer
    from verifiers.v1.utils.generic import concrete_type
    from verifiers.v1.utils.loaders import environment_class

    raw = json.loads(args.env)
    # The env class declares its own config type (SingleAgentEnvConfig for a plain taskset).
    env_cls = environment_class((raw.get("taskset") or {}).get("id", ""), raw.get("id", ""))
    config_cls = concrete_type(env_cls, EnvConfig, origin=Env) or EnvConfig
    config = config_cls.model_validate(raw)
    server = EnvServer(config=config, address=args.address, max_concurrent=args.max_concurrent or None)
    print(f"arlo_verifiers_server: serving {config.env_id} at {server.address}", flush=True)

    def stop(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        asyncio.run(server.run())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
