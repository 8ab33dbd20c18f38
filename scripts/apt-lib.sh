# Shared by the install scripts: apt-get that waits for another apt to finish (the lock)
# and retries, and installs only what is missing.
apt_updated=0
apt_retry() {
  local tries=0
  until DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 "$@"; do
    tries=$((tries + 1))
    [ $tries -ge 3 ] && return 1
    echo "apt-get $* failed; retrying in 10 s ($tries/3)" >&2
    sleep 10
  done
}
apt_install_all() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$apt_updated" = 0 ]; then apt_retry update -qq || return 1; apt_updated=1; fi
  apt_retry install -y -qq --no-install-recommends "${missing[@]}"
}
