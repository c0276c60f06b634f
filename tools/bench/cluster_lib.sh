# Shell helpers for the benchmark scripts that run real daemons on loopback
# (BIN is the folder holding hymcache-master, hymcache-storage and hymbench:
# set it, or call cluster_binaries). Port 0 everywhere: the daemons print
# what they bound.

# cluster_binaries OUT: BIN=$HYMCACHE_BENCH_BIN when set (binaries built
# already: the measurements smoke test cannot run bazel), else builds the
# daemons and hymbench with bazel -c opt and copies them to OUT/bin
# (bazel-bin follows the last build configuration). Run from the root.
cluster_binaries() {
  if [ -n "${HYMCACHE_BENCH_BIN:-}" ]; then
    BIN=$HYMCACHE_BENCH_BIN
    return
  fi
  bazel build -c opt //master:hymcache-master //storage_node:hymcache-storage \
    //tools/hymbench:hymbench >/dev/null
  BIN="$1/bin"
  mkdir -p "$BIN"
  cp -f bazel-bin/master/hymcache-master bazel-bin/storage_node/hymcache-storage \
    bazel-bin/tools/hymbench/hymbench "$BIN/"
}

PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

# wait_line FILE PATTERN: prints the first line of FILE matching PATTERN,
# waiting up to 3 minutes (a hybrid node sharing 2 cores with a test suite
# took over a minute to start).
wait_line() {
  for _ in $(seq 1800); do
    if grep -m1 "$2" "$1" 2>/dev/null; then return 0; fi
    # A daemon that exited will never print it: say why at once.
    if [ -n "${3:-}" ] && ! kill -0 "$3" 2>/dev/null; then
      echo "process $3 exited before printing '$2' in $1:" >&2
      cat "$1" "${1%.stdout}.stderr" "$(dirname "$1")/stderr" 2>/dev/null | tail -5 >&2
      return 1
    fi
    sleep 0.1
  done
  echo "timed out waiting for '$2' in $1" >&2
  cat "$1" >&2
  return 1
}

# start_master DIR [flags]: sets MASTER.
start_master() {
  local dir=$1; shift
  rm -rf "$dir"; mkdir -p "$dir"
  "$BIN/hymcache-master" --listen=127.0.0.1:0 --db_path="$dir/db" "$@" \
    >"$dir/stdout" 2>"$dir/stderr" &
  PIDS+=($!)
  MASTER=$(wait_line "$dir/stdout" "listening on" $! | awk '{print $NF}')
}

# start_node DIR NAME [flags]
start_node() {
  local dir=$1 name=$2; shift 2
  mkdir -p "$dir"
  "$BIN/hymcache-storage" --master="$MASTER" --name="$name" --data_port=0 \
    --control_port=0 "$@" >"$dir/$name.stdout" 2>"$dir/$name.stderr" &
  PIDS+=($!)
  wait_line "$dir/$name.stdout" "hymcache-storage data=" $! >/dev/null || exit 1
}

stop_all() {
  cleanup
  PIDS=()
}

# overall FILE FIELD: a number from hymbench's JSON overall row.
overall() {
  python3 -c "import json,sys; print(json.load(open('$1'))['overall']['$2'])"
}
