"""`auto` whose lookup guesses are priced by two odds, the first token's and each later one's once the one before it
held, with the bonus token scored against the guess ("after", StepController.lookup_acceptance), against one α for
every token of a guess from a record of the tokens verified ("before", as it was), beside speculation off and prompt
lookup fixed at k = 4, as policy_ab.py runs them.

    python docs/benchmarks/auto-vs-fixed/continuation_ab.py OUT_DIR [ROUNDS] [PROMPTS]
"""
import sys

from policy_ab import main, request

from specdec.policy import pools
from specdec.policy.cost_model import expected_tokens
from specdec.policy.decide import LOOKUP, MODEL, effective_alpha

VARIANTS = ["none", "ngram", "auto-before", "auto-after"]


class OneAlpha(pools.StepController):
    """The controller before: match length -> [guesses, tokens tested, tokens held], a verified guess tested as deep
    as it was verified, and one effective α for all of a guess's tokens (docs/benchmarks/lookup-depth/ab.py builds its
    arms on it). Before a bucket's first guess the prior stands for guesses as deep as the one offered; the run of
    the README took 8 tokens there (the first guess of a match length in a pool's first requests)."""

    def plan(self, n, lookup_len, budget=None):
        self.offered = lookup_len
        return super().plan(n, lookup_len, budget)

    def lookup_acceptance(self, n):
        own = self.by_n.get(self.bucket(n), [0, 0, 0])
        return self.one_alpha(n, max(1, round(own[1] / own[0])) if own[0] else self.offered)

    def one_alpha(self, n, depth):
        """One α for a match length's guesses: its own record with the pool's prior (2 guesses' worth), or, before
        the prior has any, the prior α's guesses `depth` tokens deep."""
        b = self.bucket(n)
        own = self.by_n.get(b, [0, 0, 0])
        prior = self.lookup_prior.get(b)
        w = self.lookup_prior_weight
        if prior and prior[0]:
            scale = min(1.0, w / prior[0])
            pp, pd, pa = (x * scale for x in prior)
        else:
            pd = w * depth
            pp, pa = w, w * (expected_tokens(self.lookup_alpha, depth) - 1)
        props, proposed, accepted = own[0] + pp, own[1] + pd, own[2] + pa
        return effective_alpha(1 + accepted / props, max(1, round(proposed / props))), None

    def observe_step(self, num_draft, num_accepted, emitted):
        source, n, guess = self._last
        self._last = (MODEL, 0, [])
        if source == LOOKUP:
            tested, matched = num_draft, num_accepted
        else:
            tested = min(len(guess), len(emitted))
            matched = next((j for j, (g, e) in enumerate(zip(guess, emitted)) if g != e), tested)
        self.observe(source, num_draft, num_accepted, n, tested, matched)

    def observe(self, source, num_draft, num_accepted, n=0, lookup_len=0, lookup_matched=0):
        if lookup_len:
            rec = self.by_n.setdefault(self.bucket(n), [0.0, 0.0, 0.0])
            d = self.lookup_decay
            rec[:] = [d * rec[0] + 1, d * rec[1] + lookup_len, d * rec[2] + lookup_matched]
            self.lookup_proposed += lookup_len
            self.lookup_guesses += 1
            self.lookup_matched += lookup_matched
        super().observe(source, num_draft, num_accepted, n)


def run(llm, ids, variant, params, salt):
    return request(llm, ids, variant, params, salt, OneAlpha if variant == "auto-before" else None)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2, sys.argv[3] if len(sys.argv) > 3 else "builtin",
         VARIANTS, run, [("auto-after", "auto-before"), ("auto-after", "ngram")])
