#!/usr/bin/env bash
# `make run`: start the daemon on the built-in tiny artifact, speak a sentence through it over the
# protocol, save the streamed audio to out/hello.wav, show the daemon's status, stop it (SIGTERM).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-.venv/bin}
text=${TEXT:-Hello from edged, speaking on the built-in tiny model.}
mkdir -p out
endpoint="ipc://$PWD/out/edged.sock"
"$bin/edged" serve --listen "$endpoint" > out/daemon.log 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  "$bin/edged" status --endpoint "$endpoint" --timeout 0.2 >/dev/null 2>&1 && break
  kill -0 $daemon 2>/dev/null || { cat out/daemon.log; exit 1; }
done
"$bin/edged" say "$text" --voice vivian --language english --seed 0 --max-audio-ms 4000 --no-play --out out/hello.wav --endpoint "$endpoint"
"$bin/edged" status --endpoint "$endpoint"
kill -TERM $daemon
wait $daemon
trap - EXIT
echo "wrote out/hello.wav (daemon log: out/daemon.log)"
