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

# Copy this working tree (its tracked and untracked, not ignored, files) into folder $1,
# leaving out the package: tests run there import an installed numba_hostfn, and those
# that read the package's sources skip (the `checkout` marker, tests/conftest.py).
tree_without_package() {
  mkdir -p "$1"
  git ls-files -z --cached --others --exclude-standard | grep -zv '^numba_hostfn/' |
    xargs -0 cp --parents -t "$1"
}
