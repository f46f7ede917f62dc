"""A small built-in prompt set by category (code editing copies much of the prompt; code generation
and open-ended writing do not)."""

_MEAN = '''def mean_and_std(values):
    n = 0
    total = 0.0
    for v in values:
        n += 1
        total += v
    mean = total / n
    sq = 0.0
    for v in values:
        sq += (v - mean) ** 2
    return mean, (sq / n) ** 0.5
'''
_INVENTORY = '''class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, qty):
        if name in self.items:
            self.items[name] = self.items[name] + qty
        else:
            self.items[name] = qty

    def remove(self, name, qty):
        if name not in self.items:
            raise KeyError(name)
        self.items[name] = self.items[name] - qty
        if self.items[name] <= 0:
            del self.items[name]

    def total(self):
        return sum(self.items.values())
'''
_JS = '''function groupBy(list, key) {
  var result = {};
  for (var i = 0; i < list.length; i++) {
    var item = list[i];
    var k = item[key];
    if (!result[k]) {
      result[k] = [];
    }
    result[k].push(item);
  }
  return result;
}
'''

BUILTIN_PROMPTS: list[dict] = [
    {"category": "code-edit", "messages": [{"role": "user", "content":
        "Add type hints and a docstring to this function. Reply with the full code only.\n\n" + _MEAN}]},
    {"category": "code-edit", "messages": [{"role": "user", "content":
        "Rename the class to Stock and the method `total` to `count`. Reply with the full code only.\n\n"
        + _INVENTORY}]},
    {"category": "code-edit", "messages": [{"role": "user", "content":
        "Convert this JavaScript to modern ES2020 (const/let, arrow functions). Reply with the code only.\n\n" + _JS}]},
    {"category": "code-gen", "messages": [{"role": "user", "content":
        "Write a Python function that parses an ISO-8601 date string into a (year, month, day) tuple, "
        "with validation."}]},
    {"category": "code-gen", "messages": [{"role": "user", "content":
        "Write a Python class implementing an LRU cache with get and put methods, using OrderedDict."}]},
    {"category": "code-gen", "messages": [{"role": "user", "content":
        "Write a function in Python that merges two sorted lists into one sorted list without using sort()."}]},
    {"category": "open-ended", "messages": [{"role": "user", "content":
        "Write a short story about a lighthouse keeper who finds a message in a bottle."}]},
    {"category": "open-ended", "messages": [{"role": "user", "content":
        "用中文介绍一下你最喜欢的季节，以及为什么。"}]},
    {"category": "summarize", "messages": [{"role": "user", "content":
        "Summarise in three sentences: Speculative decoding speeds up autoregressive generation by letting a "
        "small draft model propose several tokens that the large target model verifies in a single forward pass. "
        "Because verification uses rejection sampling, the output distribution is exactly the target's. The "
        "speedup depends on how often the target accepts the draft's tokens and on how cheap the draft is."}]},
    {"category": "summarize", "messages": [{"role": "user", "content":
        "用两句话总结下面这段文字：缓存是一种把常用数据放在更快的存储里的技术。当程序再次需要这些数据时，"
        "它可以直接从缓存中读取，而不必访问较慢的磁盘或网络。缓存的难点在于决定保留哪些数据、何时淘汰旧数据，"
        "以及如何保证缓存中的数据与原始数据一致。"}]},
]
