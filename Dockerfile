# stream-dedup: `serve` (the Kafka service + HTTP API) by default; any subcommand works:
#   docker build -t stream-dedup:local .
#   docker run --rm stream-dedup:local replay --help
# Every dependency ships binary wheels for linux/amd64 and linux/arm64 (CPython 3.11), so the
# slim image needs no compiler.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY stream_dedup ./stream_dedup
RUN pip install . \
 && rm -rf /src \
 && useradd --create-home --uid 10001 --user-group dedup

USER dedup
WORKDIR /home/dedup
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
ENTRYPOINT ["stream-dedup"]
CMD ["serve", "--http-host", "0.0.0.0", "--http-port", "8080"]
