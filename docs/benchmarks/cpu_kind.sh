# Sourced by the benchmark scripts that keep one output folder per machine kind: `cpu_kind` prints amd-avx512,
# amd-avx2, intel-avx512 or intel-avx2 (figures differ between kinds, so each keeps its raw files).
cpu_kind() {
  local v; v=$(grep -q AuthenticAMD /proc/cpuinfo && echo amd || echo intel)
  grep -q avx512f /proc/cpuinfo && echo "$v-avx512" || echo "$v-avx2"
}
