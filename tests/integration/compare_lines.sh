# Sourced by the litdata tests: same FILE_A FILE_B WHAT passes (prints "ok: WHAT equal") when
# FILE_A (Python's lines) is not empty and equals FILE_B (C++'s), else prints the first
# difference and exits 1.
same() {
  if [ ! -s "$1" ] || ! cmp -s "$1" "$2"; then
    echo "FAIL: $3 differ ($(wc -l < "$1") lines from Python, $(wc -l < "$2") from C++); first difference:"
    diff "$1" "$2" | head -4 | cut -c1-300
    exit 1
  fi
  echo "ok: $3 equal ($(wc -l < "$1") lines)"
}
