#!/usr/bin/env bash
# Configure the DVC remote that `dvc push` fills and training nodes `dvc pull` from. Writes .dvc/config (commit it,
# so every clone knows the remote); never writes credentials.
#
#   scripts/remote.sh local [DIR]                   # a directory (local disk, NFS mount); default ../imagenet-parquet-remote
#   scripts/remote.sh s3 s3://BUCKET/PREFIX [ENDPOINT_URL]   # S3 or S3-compatible (MinIO, Ceph, ...) via dvc-s3
#
# The remote becomes the default (`dvc push` / `dvc pull` without -r). S3 credentials come from the environment
# (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY [/ AWS_SESSION_TOKEN], AWS_PROFILE, ~/.aws, instance roles), or per
# checkout in the git-ignored .dvc/config.local: `dvc remote modify --local s3 profile NAME`.
set -euo pipefail

die() { echo "scripts/remote.sh: $*" >&2; exit 2; }
command -v dvc >/dev/null || die "expected the dvc command on PATH, found none; activate the project's .venv"
root=$(git rev-parse --show-toplevel 2>/dev/null) || die "expected to run inside the project's git checkout"
cd "$root"

case "${1:-}" in
  local)
    dir=${2:-$root/../imagenet-parquet-remote}
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd -P)
    dvc remote add --force --default local "$dir"
    ;;
  s3)
    url=${2:-}
    [[ $url == s3://?* ]] || die "expected an S3 URL like s3://bucket/prefix as the second argument, found '${url}'"
    dvc remote add --force --default s3 "$url"
    if [[ -n ${3:-} ]]; then  # `add --force` above already dropped any previous endpointurl
      dvc remote modify s3 endpointurl "$3"
    fi
    ;;
  *)
    die "expected 'local [DIR]' or 's3 s3://BUCKET/PREFIX [ENDPOINT_URL]', found '${*:-nothing}'"
    ;;
esac
dvc remote list
