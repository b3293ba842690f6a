#!/bin/sh
# Starts `weed mini` (master, volume, filer and S3 gateway in one process) for the compose cluster.
# Telemetry off; S3 on port 8333 only; the buckets in S3_BUCKETS are created at start. With
# AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY set, only requests signed with them are accepted.
set -eu
exec weed mini \
    -dir=/data \
    -ip=127.0.0.1 -ip.bind=0.0.0.0 \
    -master.telemetry=false -master.telemetry.url=http://127.0.0.1:1/ \
    -webdav=false -admin.ui=false \
    -s3.port=8333 -s3.port.iceberg=0 -s3.port.lance=0 \
    -bucket="${S3_BUCKETS:-raftline}" \
    "$@"
