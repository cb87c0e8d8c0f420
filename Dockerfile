# compaction-proxy: docker build -t compaction-proxy . && docker run -p 8080:8080 compaction-proxy
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY proxy ./proxy
COPY compaction ./compaction
COPY config.yaml ./config.yaml
RUN pip install . \
    && useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin proxy \
    && mkdir -p /data/memory /data/state \
    && chown -R proxy /data

# Inside the container the proxy must listen on all interfaces to be reachable through -p;
# outside it, the default stays 127.0.0.1. Memory files and the state file go to volumes.
ENV COMPACTION_PROXY__SERVER__HOST=0.0.0.0 \
    COMPACTION_PROXY__MEMORY__DIR=/data/memory \
    COMPACTION_PROXY__STATE__PATH=/data/state/state.sqlite3
VOLUME ["/data/memory", "/data/state"]
EXPOSE 8080
USER proxy

HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4).status == 200 else 1)"]

CMD ["compaction-proxy", "--config", "/app/config.yaml"]
