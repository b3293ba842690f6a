# Raftline broker node image. `docker compose up` builds it from python:3.11-slim; where no registry
# is reachable, scripts/build-image.sh builds the same file on a locally made Debian base (BASE=...).
ARG BASE=python:3.11-slim

# Stage 1: wheels. Wheels already built on the host (build/wheels, from scripts/build-image.sh) are
# used as they are; otherwise pip builds them here, which needs PyPI.
FROM ${BASE} AS wheels
LABEL org.opencontainers.image.title=raftline
COPY . /src
RUN set -eu; mkdir -p /wheels; \
    if ls /src/build/wheels/*.whl >/dev/null 2>&1; then \
        cp /src/build/wheels/*.whl /wheels/; \
    else \
        python3 -m venv /opt/build-venv && /opt/build-venv/bin/pip wheel --wheel-dir /wheels /src; \
    fi

# Stage 2: runtime. `python3 -m venv` works on both bases (python:3.11-slim ships python3 in
# /usr/local/bin, a Debian base in /usr/bin), so nothing below names an interpreter path.
FROM ${BASE}
LABEL org.opencontainers.image.title=raftline
RUN python3 -m venv /opt/raftline
COPY --from=wheels /wheels /tmp/wheels
RUN /opt/raftline/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheels raftline \
    && rm -rf /tmp/wheels
RUN useradd --system --create-home --uid 10001 raftline \
    && mkdir -p /var/lib/raftline && chown raftline:raftline /var/lib/raftline
ENV PATH=/opt/raftline/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    RAFTLINE_DATA_DIR=/var/lib/raftline \
    RAFTLINE_HTTP=0.0.0.0:8080 \
    RAFTLINE_RAFT=0.0.0.0:9090
USER raftline
WORKDIR /var/lib/raftline
VOLUME ["/var/lib/raftline"]
EXPOSE 8080 9090
# Ready means joined and caught up on metadata (API.md). Ask at the address the node listens on
# (RAFTLINE_HTTP), using loopback when it listens on every interface.
HEALTHCHECK --interval=5s --timeout=3s --start-period=20s --retries=3 \
    CMD python3 -c "import os,urllib.request; h,p=os.environ['RAFTLINE_HTTP'].rsplit(':',1); h='127.0.0.1' if h in ('0.0.0.0','[::]','') else h; urllib.request.urlopen('http://'+h+':'+p+'/readyz', timeout=2)"
ENTRYPOINT ["raftline"]
CMD ["serve"]
