"""Log lines as nanoGPT and nanochat print them: their print statements copied verbatim from
karpathy/nanoGPT (train.py at 3adf61e1: lines 102, 265, 327; configurator.py line 44) and karpathy/nanochat
(scripts/base_train.py at 92d63d4: lines 427, 565-567), called with the values those programs would hold.
"""


def nanogpt_tokens_per_iter(tokens_per_iter):
    return f"tokens per iteration will be: {tokens_per_iter:,}"


def nanogpt_override(key, attempt):
    return f"Overriding: {key} = {attempt}"


def nanogpt_eval(iter_num, losses):
    return f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"


def nanogpt_iter(iter_num, lossf, dt, running_mfu):
    return f"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu {running_mfu*100:.2f}%"


def nanochat_step(step, num_iterations, debiased_smooth_loss, lrm, dt, total_batch_size, mfu,
                  total_training_time, dataloader_state_dict):
    pct_done = 100 * step / num_iterations
    tok_per_sec = int(total_batch_size / dt)
    steps_done = step - 10
    if steps_done > 0:
        eta_seconds = (num_iterations - step) * total_training_time / steps_done
        eta_str = f" | eta: {eta_seconds/60:.1f}m"
    else:
        eta_str = ""
    epoch = f"{dataloader_state_dict['epoch']} pq: {dataloader_state_dict['pq_idx']} rg: {dataloader_state_dict['rg_idx']}"  # noqa: E501
    return f"step {step:05d}/{num_iterations:05d} ({pct_done:.2f}%) | loss: {debiased_smooth_loss:.6f} | lrm: {lrm:.2f} | dt: {dt * 1000:.2f}ms | tok/sec: {tok_per_sec:,} | bf16_mfu: {mfu:.2f} | epoch: {epoch} | total time: {total_training_time/60:.2f}m{eta_str}"  # noqa: E501


def nanochat_val(step, val_bpb):
    return f"Step {step:05d} | Validation bpb: {val_bpb:.6f}"


RUN_LINE = "ddplab: run r1 rank 0/2 on node0 master 10.0.0.1:29500 iface eth0 threads 1"
DL = {"epoch": 1, "pq_idx": 0, "rg_idx": 3}


def nanogpt_log(max_iters=6):
    lines = [RUN_LINE, "Overriding config with config/train_shakespeare_char.py:", "max_iters = 5000",
             "lr_decay_iters = 5000 # make equal to max_iters usually", "",
             nanogpt_override("max_iters", max_iters), nanogpt_tokens_per_iter(2 * 2 * 12 * 64)]
    for i in range(max_iters + 1):
        if i % 3 == 0:
            lines.append(nanogpt_eval(i, {"train": 4.2 - i / 10, "val": 4.3 - i / 10}))
        dt, mfu = (0.5 if i == 0 else 0.1 + i / 1000), (-1.0 if i < 5 else 0.0123)  # nanoGPT's first mfu: -1
        lines.append(nanogpt_iter(i, 4.0 - i / 10, dt, mfu))
    return lines


def nanochat_log(num_iterations=20, upto=20, total_batch_size=524288):
    lines = [RUN_LINE, f"Using user-provided number of iterations: {num_iterations:,}"]
    for s in range(upto):
        if s % 10 == 0:
            lines.append(nanochat_val(s, 3.0 - s / 100))
        dt = 2.0 if s == 0 else 0.25 + s / 1000
        lines.append(nanochat_step(s, num_iterations, 10.4 - s / 10, 1.0, dt, total_batch_size, 0.0,
                                   0.25 * max(0, s - 10), DL))
    return lines


def write(path, lines, newline=True):
    path.write_text("\n".join(lines) + ("\n" if newline else ""))
    return str(path)
