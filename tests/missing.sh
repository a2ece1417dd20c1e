# Sourced by test scripts. missing REASON: a tool or peer that scripts/install-deps.sh installs (or
# root, for namespaces and mounts) is not here. Outside CI the test skips (exit 77, CTest's
# SKIP_RETURN_CODE); under CI=true it fails: only a missing GPU may skip there (docs/testing.md).
missing() {
  if [ "${CI:-}" = true ]; then
    echo "FAIL: $* (under CI=true a missing tool or peer fails the test; scripts/install-deps.sh installs it)"
    exit 1
  fi
  echo "SKIPPED: $*"
  exit 77
}
