# The engram worker image: `engram up` against Kafka, ClickHouse and Qdrant
# servers (see docker-compose.yml for the ENGRAM_* variables that point at them).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A regular (non-editable) install: pyproject.toml lists the packages; setup.py
# compiles the fold and the wire codec with mypyc, hence the C compiler, removed after
# the build.
COPY . /tmp/engram
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install /tmp/engram \
    && apt-get purge -y --auto-remove gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/* /tmp/engram

RUN useradd --system --create-home --home-dir /home/engram --uid 10001 engram \
    && mkdir -p /var/lib/engram \
    && chown engram:engram /var/lib/engram

# ENGRAM_HOME holds up.json; faust creates its (empty, in-memory store) data
# directory in the working directory.
ENV ENGRAM_HOME=/var/lib/engram \
    ENGRAM_HTTP=0.0.0.0:8321
WORKDIR /home/engram
USER engram

EXPOSE 8321
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8321/v1/health', timeout=4)"]

ENTRYPOINT ["engram"]
CMD ["up"]
