"""``python -m agent --manager ws://127.0.0.1:8000 --token TOKEN``: run the node daemon."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from agent.backends.base import Backend
from agent.config import AgentConfig, config_from_args
from agent.daemon import Agent

log = logging.getLogger("agent")


def make_backend(config: AgentConfig) -> Backend:
    """The requested backend; ``auto`` picks Docker when an engine answers a ping."""
    if config.backend in ("docker", "auto"):
        try:
            import docker

            if config.docker_host:
                client = docker.DockerClient(base_url=config.docker_host, timeout=30)
            else:
                client = docker.from_env(timeout=30)
            client.ping()
        except Exception as exc:  # noqa: BLE001 - any failure means "no usable engine"
            if config.backend == "docker":
                raise SystemExit(f"no Docker engine answers: {exc}") from exc
            log.info("no Docker engine answers (%s); using the process backend", exc)
        else:
            from agent.backends.docker import DockerBackend

            return DockerBackend(config, client=client)
    from agent.backends.process import ProcessBackend

    return ProcessBackend(config)


async def amain(config: AgentConfig) -> int:
    backend = make_backend(config)
    if config.metrics_address:
        from agent import metrics

        metrics.serve(config.metrics_address, backend)
    agent = Agent(config, backend)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, agent.stop)
    return await agent.run()


def main(argv: list[str] | None = None) -> int:
    config, ns = config_from_args(argv)
    logging.basicConfig(
        level=ns.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("docker").setLevel(max(logging.INFO, logging.getLogger().level))
    logging.getLogger("urllib3").setLevel(max(logging.INFO, logging.getLogger().level))
    log.info(
        "agent starting: manager %s, backend %s%s, resource group %s",
        config.manager,
        config.backend,
        f" on {config.docker_host}" if config.docker_host else "",
        config.resource_group,
    )
    return asyncio.run(amain(config))


if __name__ == "__main__":
    sys.exit(main())
