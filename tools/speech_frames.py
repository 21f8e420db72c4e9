"""Real speech for voice-activity models, made with Debian's espeak-ng: sentences spoken at
16 kHz with a second of silence before, between and after them, cut into frames as a
streaming model takes them, saved as a .npz (``input`` [T, context + frame] float32 in [-1, 1],
``sr`` the sample rate); and the same for near-silence (a microphone's noise floor).

    python tools/speech_frames.py OUT_DIR [--frame 512] [--context 64]
    # -> OUT_DIR/speech.npz, OUT_DIR/silence.npz, OUT_DIR/speech_mask.npy (frames with speech)

A frame is ``context`` samples of the previous frame followed by ``frame`` new ones (what a
Silero-style VAD expects); ``speech_mask`` marks frames that hold any spoken sample.
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np

RATE = 16_000
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Edge devices listen for speech and answer within a few milliseconds.",
    "Voice activity detection finds the frames where someone speaks.",
)


def speak(text: str) -> np.ndarray:
    """``text`` spoken by espeak-ng, as float32 samples at 16 kHz."""
    from scipy.signal import resample_poly

    if shutil.which("espeak-ng") is None:
        raise SystemExit("espeak-ng is missing: apt-get install espeak-ng")
    wav = subprocess.run(["espeak-ng", "--stdout", text], check=True, capture_output=True).stdout
    with wave.open(io.BytesIO(wav)) as w:
        rate = w.getframerate()
        samples = np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32)
    return np.asarray(resample_poly(samples / 32768.0, RATE, rate), np.float32)


def frames(audio: np.ndarray, frame: int, context: int) -> np.ndarray:
    """[T, context + frame]: each frame with the last ``context`` samples before it."""
    count = len(audio) // frame
    padded = np.concatenate([np.zeros(context, np.float32), audio[: count * frame]])
    return np.stack([padded[i * frame : i * frame + frame + context] for i in range(count)])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", type=Path)
    parser.add_argument("--frame", type=int, default=512)
    parser.add_argument("--context", type=int, default=64)
    args = parser.parse_args(argv)
    silence = np.zeros(RATE, np.float32)
    parts, spoken = [silence], [np.zeros(RATE, bool)]
    for sentence in SENTENCES:
        voice = speak(sentence)
        parts += [voice, silence]
        spoken += [np.abs(voice) > 0, np.zeros(RATE, bool)]
    audio, mask = np.concatenate(parts), np.concatenate(spoken)
    noise = np.random.default_rng(0).normal(0.0, 1e-3, 4 * RATE).astype(np.float32)
    sr = np.array(RATE, np.int64)
    args.out.mkdir(parents=True, exist_ok=True)
    np.savez(args.out / "speech.npz", input=frames(audio, args.frame, args.context), sr=sr)
    np.savez(args.out / "silence.npz", input=frames(noise, args.frame, args.context), sr=sr)
    count = len(audio) // args.frame
    np.save(args.out / "speech_mask.npy", mask[: count * args.frame].reshape(count, -1).any(1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
