#!/usr/bin/env bash
# One-step set-up on Debian/Ubuntu: Vulkan loader + lavapipe (CPU fallback) + shader tools,
# a Python environment in .venv with vkdflash installed, then the main job.
#   ./setup.sh            set up, then run `vkdflash devices` and `vkdflash conformance`
#   ./setup.sh --no-run   set up only
set -euo pipefail
cd "$(dirname "$0")"

apt_packages=(libvulkan1 mesa-vulkan-drivers vulkan-tools glslc spirv-tools python3-venv)
missing=()
for p in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "setup: installing ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

python=${PYTHON:-python3}
# a .venv without pip (`python3 -m venv` run before python3-venv was installed, or stopped midway) is made again
if ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
    "$python" -m venv --clear .venv
fi
# installed already for this pyproject.toml (the stamp): nothing to fetch, so a second run works offline
stamp=.venv/.vkdflash-setup
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && .venv/bin/python -c "import vkdflash" 2>/dev/null; then
    echo "setup: .venv already holds vkdflash for this pyproject.toml"
else
    .venv/bin/python -m pip install -q --upgrade pip >/dev/null
    .venv/bin/python -m pip install -q -e '.[test]'
    echo "$want" > "$stamp"
fi
echo "setup: done; vkdflash is .venv/bin/vkdflash"

if [ "${1:-}" != "--no-run" ]; then
    .venv/bin/vkdflash devices
    .venv/bin/vkdflash conformance
fi
