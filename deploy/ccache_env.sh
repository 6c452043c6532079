# Sourced by the build scripts (deploy/build.sh, deploy/sanitize.sh, deploy/check_stock_cmake.sh)
# from the repository root. Makes ccache's results reusable by every checkout of the
# repository on this machine, whatever folder it is cloned into: paths under the checkout are
# hashed relative to it (base_dir), and the compile's working directory is left out of the hash
# of debug builds (hash_dir off; the sanitizer jobs build with -g). CI's clean clone then hits
# the cache a developer's build (or an earlier CI run) filled. Debug info of an object taken from
# the cache names the folder of the checkout that compiled it first; line numbers are the same.
# Settings already in the environment win.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
