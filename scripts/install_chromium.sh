#!/usr/bin/env bash
# Install Debian's Chromium and chromedriver for the browser tests (pytest marker `browser`).
# Needs root and apt-get. Without either it says so and exits 0: the browser tests then skip,
# with the reason, as they do anywhere Chromium is missing. Quiet: apt's output goes to a log
# that is shown only if the install fails (exit 1). Idempotent: present means nothing to do.
set -uo pipefail
have() { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }
# Debian's chromium wrapper prints a shell warning on stderr with --version; only the version matters
version() { chromium --version 2>/dev/null | head -1; }
if have; then
  echo "[chromium] present: $(version)"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "[chromium] no apt-get on this machine: not installed; the browser tests will be skipped"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "[chromium] not root: not installed (as root: apt-get install chromium chromium-driver);" \
       "the browser tests will be skipped"
  exit 0
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
export DEBIAN_FRONTEND=noninteractive
# wait for another apt/dpkg (say, unattended upgrades on a fresh machine) instead of failing at once
APT=(apt-get -q -o DPkg::Lock::Timeout=180)
echo "[chromium] installing chromium and chromium-driver from Debian's packages"
for attempt in 1 2 3; do
  if "${APT[@]}" update >"$log" 2>&1 \
     && "${APT[@]}" install -y --no-install-recommends chromium chromium-driver >>"$log" 2>&1 && have; then
    echo "[chromium] installed: $(version)"
    exit 0
  fi
  [ "$attempt" -lt 3 ] && sleep $((attempt * 10))
done
echo "[chromium] install failed after 3 attempts; apt's last lines:" >&2
tail -n 20 "$log" >&2
exit 1
