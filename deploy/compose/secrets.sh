#!/bin/sh
# The compose project's secrets, made once at its first start by the one-shot `secrets` service
# (docker-compose.yml) into the `secrets` volume, so that no password is written in the repository
# or in docker-compose.yml, and `docker compose down -v` wipes them with the database:
#   postgres-password   PostgreSQL's superuser password; owner 999 (postgres in the postgres
#                       image, which reads it through POSTGRES_PASSWORD_FILE), mode 600;
#   database-url        alert-sink's connection string (--database-url-file); owner 10001 (the
#                       price-alerts image's user), mode 600, as alert-sink requires of a file
#                       holding a password.
# Runs as root (to give each file its owner); run again, it keeps what exists.
#
#   docker compose run --rm -T secrets host-url   prints the URL from the host (127.0.0.1:15432),
#                                                  for the tests and tools run outside the containers
set -eu
dir=/run/secrets/price-alerts
umask 077
if [ ! -s "$dir/postgres-password" ]; then
  # 24 characters from 18 random bytes, URL-safe (it goes into the connection string as it is).
  password=$(head -c 18 /dev/urandom | base64 | tr '+/' '-_')
  printf '%s' "$password" >"$dir/postgres-password.new"
  printf 'postgres://postgres:%s@postgres:5432/postgres\n' "$password" >"$dir/database-url.new"
  chown 999:999 "$dir/postgres-password.new"
  chown 10001:10001 "$dir/database-url.new"
  chmod 600 "$dir/postgres-password.new" "$dir/database-url.new"
  # The URL first: a password file is only there once its URL is.
  mv "$dir/database-url.new" "$dir/database-url"
  mv "$dir/postgres-password.new" "$dir/postgres-password"
fi
if [ "${1:-}" = host-url ]; then
  printf 'postgres://postgres:%s@127.0.0.1:15432/postgres\n' "$(cat "$dir/postgres-password")"
fi
