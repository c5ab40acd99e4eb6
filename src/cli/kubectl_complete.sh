#!/bin/sh
# Completion of `kubectl lock` and `kubectl unlock` for kubectl 1.26+, which runs this program
# (as kubectl_complete-lock or kubectl_complete-unlock) with the words typed after the plugin's
# name, the last one being the word to complete. Prints the candidates, one a line (then a tab
# and what it is), then `:4` (no file names). The flags come from kubectl-lock's own command
# line; resource types and object names from the cluster, with a 2 s request timeout (3 s in
# all), and none when it cannot be asked.
# Printed by `kubectl lock completion kubectl` from its own command line: do not edit.

case "${0##*/}" in
*unlock) cmd=unlock ;;
*) cmd=lock ;;
esac
tab="$(printf '\t')"

# The words before the last: the cluster flags (passed on to kubectl), the positionals.
kubeconfig="" context="" namespace="" expect="" first="" positional=0 list=no cur=""
last=$#
i=0
for word in "$@"; do
    i=$((i + 1))
    if [ "$i" -eq "$last" ]; then
        cur=$word
        break
    fi
    if [ -n "$expect" ]; then
        case "$expect" in
        --kubeconfig) kubeconfig=$word ;;
        --context) context=$word ;;
        -n | --namespace) namespace=$word ;;
        esac
        expect=""
        continue
    fi
    case "$word" in
    --kubeconfig=*) kubeconfig=${word#*=} ;;
    --context=*) context=${word#*=} ;;
    --namespace=*) namespace=${word#*=} ;;
    -n?*) namespace=${word#-n} ;;
    -*) if takes_value "$word"; then expect=$word; fi ;;
    *)
        positional=$((positional + 1))
        if [ "$positional" -eq 1 ]; then
            first=$word
            if [ "$cmd" = lock ] && [ "$word" = list ]; then list=yes; fi
        fi
        ;;
    esac
done

# kubectl with the cluster flags typed so far; nothing at all when it fails or is slow.
k() {
    command -v kubectl >/dev/null 2>&1 || return 0
    set -- --request-timeout=2s ${kubeconfig:+"--kubeconfig=$kubeconfig"} \
        ${context:+"--context=$context"} "$@"
    if command -v timeout >/dev/null 2>&1; then
        timeout 3 kubectl "$@" 2>/dev/null
    else
        kubectl "$@" 2>/dev/null
    fi
}
# The candidates that start with the word being completed.
emit() {
    while IFS= read -r line; do
        case "${line%%"$tab"*}" in
        "$cur"*) printf '%s\n' "$line" ;;
        esac
    done
}
resources() { k api-resources --verbs=delete -o name; }
names() { # RESOURCE: the names of its objects in the namespace typed (or the context's)
    k get "$1" -o name ${namespace:+"--namespace=$namespace"} | sed 's|^[^/]*/||'
}
flags() {
    if [ "$cmd" = unlock ]; then
        unlock_flags
    elif [ "$list" = yes ]; then
        list_flags
    else
        lock_flags
    fi
}

if [ -n "$expect" ]; then
    case "$expect" in
    --kubeconfig)
        echo ':0' # file names
        exit 0
        ;;
    -n | --namespace) k get namespaces -o name | sed 's|^namespace/||' | emit ;;
    --context) k config get-contexts -o name | emit ;;
    *) values_of "$expect" | emit ;;
    esac
    echo ':4'
    exit 0
fi

case "$cur" in
-*) flags | emit ;;
*/*)
    resource=${cur%%/*}
    names "$resource" | while IFS= read -r name; do printf '%s/%s\n' "$resource" "$name"; done | emit
    ;;
*)
    if [ "$list" = yes ]; then
        :
    elif [ "$positional" -eq 0 ]; then
        {
            if [ "$cmd" = lock ]; then printf 'list\t%s\n' 'list the locks'; fi
            resources
        } | emit
    elif [ "$positional" -eq 1 ]; then
        case "$first" in
        */*) ;;
        *) names "$first" | emit ;;
        esac
    fi
    ;;
esac
echo ':4'
