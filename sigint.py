import subprocess, time, sys, signal
cmd = sys.argv[2:]; t=float(sys.argv[1])
s=time.time(); p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
time.sleep(t); p.send_signal(signal.SIGINT); out, err = p.communicate()
print(f"t={t} rc={p.returncode} elapsed={time.time()-s:.2f}", out.strip()[-200:], "|", err.strip()[-300:])
