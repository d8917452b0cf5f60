#!/usr/bin/env bash
# Nightly sweep: every inventory device × the models below, regressions confirmed, report written.
# Run from the farm checkout. Logs to .farm/nightly-DATE.log; exit code is farm's sweep's (1: incomplete, its
# cells named in the error: and hint: lines it prints on stderr).
#
# cron (02:30 every night):
#   30 2 * * *  cd /srv/farm && bash tools/nightly.sh >> .farm/cron.log 2>&1
# systemd timer: see the unit files printed by `bash tools/nightly.sh --systemd`.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--systemd" ]; then
  cat <<UNIT
# /etc/systemd/system/farm-nightly.service
[Unit]
Description=farm nightly sweep
[Service]
Type=oneshot
WorkingDirectory=$PWD
ExecStart=/usr/bin/env bash $PWD/tools/nightly.sh

# /etc/systemd/system/farm-nightly.timer
[Unit]
Description=farm nightly sweep at 02:30
[Timer]
OnCalendar=*-*-* 02:30:00
Persistent=true
[Install]
WantedBy=timers.target
UNIT
  exit 0
fi

farm=.venv/bin/farm
log=".farm/nightly-$(date +%Y%m%d).log"
mkdir -p .farm
models=${FARM_NIGHTLY_MODELS:-"mlp convnet mobile-block"}
model_args=()
for m in $models; do model_args+=(--model "$m"); done

"$farm" tracker start >>"$log" 2>&1
"$farm" serve >>"$log" 2>&1 || echo "some devices did not come up; the sweep stores their cells as offline" >>"$log"
# A sweep killed mid-way (reboot, OOM) is finished first, then tonight's runs.
"$farm" sweep --resume --if-incomplete --no-report >>"$log" 2>&1 || true
status=0
"$farm" sweep "${model_args[@]}" --confirm --json >".farm/nightly-$(date +%Y%m%d).json" 2>>"$log" || status=$?
# an incomplete sweep (a cell offline or failed) or an error: farm's last two lines (error: and hint:) for cron's mail
[ "$status" = 0 ] || tail -n 2 "$log" >&2
echo "nightly done: $(grep -o '"report": "[^"]*"' ".farm/nightly-$(date +%Y%m%d).json")" >>"$log"
exit "$status"
