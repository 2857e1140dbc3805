# stream-dedup: `serve` (the Kafka service + HTTP API) by default; any subcommand works:
#   docker build -t stream-dedup:local .
#   docker run --rm stream-dedup:local replay --help
# Dependencies ship binary wheels for linux/amd64 and linux/arm64 (CPython 3.11). The project's
# own C kernels (stream_dedup/core/_native.c) are compiled in a build stage, so the runtime
# image carries no compiler.
FROM python:3.11-slim AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY stream_dedup ./stream_dedup
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY --from=build /wheels /wheels
RUN pip install /wheels/*.whl \
 && python -c "import stream_dedup.core._native" \
 && rm -rf /wheels \
 && useradd --create-home --uid 10001 --user-group dedup

USER dedup
WORKDIR /home/dedup
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
ENTRYPOINT ["stream-dedup"]
CMD ["serve", "--http-host", "0.0.0.0", "--http-port", "8080"]
