# Shell functions for .ci/run and .ci/wheels (sourced, not run).

# The interpreter of one Python version: pyenv's, or one on PATH (a pyenv shim on PATH
# may name a version that is not selected: each candidate is run to check it).
python_of() {
  local version=$1 candidate
  for candidate in "$HOME"/.pyenv/versions/"$version".*/bin/"python$version" "python$version"; do
    if "$candidate" -c "import sys; assert '%d.%d' % sys.version_info[:2] == '$version'" \
      >/dev/null 2>&1; then
      command -v "$candidate"
      return
    fi
  done
  echo "no Python $version on this machine (~/.pyenv/versions or PATH)" >&2
  return 1
}
