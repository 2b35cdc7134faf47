"""The default scorer's lexicons: the cues of importance, polarity and confidence, the
negators and intensifiers, for English and Chinese.

They are the defaults of :class:`~processors.state.ScoringParams`, which a
configuration may replace; :mod:`processors.scoring` reads them.
"""

from __future__ import annotations

from collections.abc import Mapping

IMPORTANCE_MARKERS: Mapping[str, float] = {
    # English
    "remember": 2.0, "don't forget": 2.0, "dont forget": 2.0, "do not forget": 2.0,
    "important": 2.0, "importantly": 1.5, "crucial": 2.0, "critical": 2.0,
    "essential": 1.5, "urgent": 2.0, "asap": 1.5, "always": 1.0, "never": 1.0,
    "must": 1.5, "make sure": 1.5, "deadline": 2.0, "due": 1.0, "allergic": 3.0,
    "allergy": 3.0, "allergies": 3.0, "password": 2.5, "pin": 1.5, "birthday": 2.0,
    "anniversary": 2.0, "wedding": 1.5, "married": 1.5, "pregnant": 2.0,
    "diagnosed": 2.5, "hospital": 1.5, "emergency": 2.5, "address": 1.0,
    "phone number": 1.0, "promise": 1.5, "prefer": 1.0, "preference": 1.0,
    "favorite": 1.0, "favourite": 1.0,
    # Chinese
    "记住": 2.0, "别忘": 2.0, "不要忘": 2.0, "重要": 2.0, "关键": 1.5, "紧急": 2.0,
    "一定": 1.5, "千万": 1.5, "务必": 1.5, "必须": 1.5, "永远": 1.0, "从不": 1.0,
    "绝不": 1.0, "总是": 1.0, "过敏": 3.0, "截止": 2.0, "期限": 1.5, "生日": 2.0,
    "纪念日": 2.0, "密码": 2.5, "结婚": 1.5, "怀孕": 2.0, "确诊": 2.5, "医院": 1.5,
    "急诊": 2.5, "地址": 1.0, "电话": 1.0, "答应": 1.5, "承诺": 1.5, "偏好": 1.0,
    "最爱": 1.0,
}  # fmt: skip
"""Cue -> importance added when the cue occurs (each distinct cue counts once)."""

POLARITY: Mapping[str, float] = {
    # English, positive
    "love": 0.9, "loved": 0.9, "loves": 0.9, "like": 0.5, "liked": 0.5, "likes": 0.5,
    "enjoy": 0.6, "enjoyed": 0.6, "great": 0.7, "good": 0.5, "excellent": 0.8,
    "amazing": 0.8, "awesome": 0.8, "wonderful": 0.8, "fantastic": 0.8, "perfect": 0.7,
    "happy": 0.7, "glad": 0.6, "thanks": 0.5, "thank you": 0.5, "appreciate": 0.6,
    "nice": 0.5, "excited": 0.7, "best": 0.6, "beautiful": 0.6, "helpful": 0.5,
    "pleased": 0.6, "delighted": 0.8, "satisfied": 0.6, "fun": 0.5, "cool": 0.4,
    # English, negative
    "hate": -0.9, "hated": -0.9, "hates": -0.9, "terrible": -0.8, "awful": -0.8,
    "horrible": -0.8, "bad": -0.6, "worst": -0.8, "angry": -0.8, "annoyed": -0.6,
    "annoying": -0.6, "frustrated": -0.7, "frustrating": -0.7, "sad": -0.6,
    "upset": -0.7, "disappointed": -0.7, "disappointing": -0.7, "sorry": -0.3,
    "wrong": -0.4, "broken": -0.5, "failed": -0.5, "worried": -0.5, "afraid": -0.5,
    "scared": -0.6, "hurt": -0.6, "dislike": -0.6, "useless": -0.7, "stupid": -0.7,
    "disgusting": -0.8, "furious": -0.9, "unhappy": -0.7, "painful": -0.6,
    # Chinese, positive
    "喜欢": 0.6, "爱": 0.7, "热爱": 0.8, "太好了": 0.8, "很好": 0.6, "真好": 0.6,
    "好棒": 0.8, "棒": 0.7, "不错": 0.5, "谢谢": 0.5, "感谢": 0.6, "开心": 0.7,
    "高兴": 0.7, "快乐": 0.7, "满意": 0.6, "完美": 0.7, "优秀": 0.6, "精彩": 0.6,
    "厉害": 0.5, "幸福": 0.8, "兴奋": 0.6, "期待": 0.5, "赞": 0.6, "舒服": 0.5,
    "顺利": 0.5, "成功": 0.5,
    # Chinese, negative
    "讨厌": -0.8, "恨": -0.8, "糟糕": -0.7, "生气": -0.7, "愤怒": -0.9, "失望": -0.7,
    "难过": -0.7, "伤心": -0.7, "郁闷": -0.6, "不爽": -0.6, "差劲": -0.7, "太差": -0.7,
    "很差": -0.6, "不好": -0.5, "不满": -0.6, "垃圾": -0.7, "痛苦": -0.8, "担心": -0.5,
    "害怕": -0.6, "焦虑": -0.6, "崩溃": -0.8, "后悔": -0.6, "抱歉": -0.2, "对不起": -0.3,
    "失败": -0.5, "无聊": -0.5, "难受": -0.6, "恶心": -0.8, "气死": -0.9, "可惜": -0.4,
    "烦": -0.5,
}  # fmt: skip
"""Cue -> polarity in [-1, 1]; flipped (and damped) when negated."""

CONFIDENCE_CUES: Mapping[str, float] = {
    # hedges
    "maybe": -0.15, "perhaps": -0.15, "probably": -0.1, "possibly": -0.15,
    "might": -0.1, "i think": -0.1, "i guess": -0.15, "i believe": -0.05,
    "not sure": -0.2, "unsure": -0.2, "i don't know": -0.2, "no idea": -0.2,
    "seems": -0.1, "kind of": -0.05, "sort of": -0.05, "not necessarily": -0.1,
    "可能": -0.15, "也许": -0.15, "或许": -0.15, "大概": -0.1, "好像": -0.1,
    "似乎": -0.1, "我觉得": -0.05, "估计": -0.1, "说不定": -0.15, "不确定": -0.2,
    "不知道": -0.15, "不一定": -0.15,
    # assertions
    "definitely": 0.1, "certainly": 0.1, "absolutely": 0.1, "for sure": 0.1,
    "i'm sure": 0.1, "confirmed": 0.15, "exactly": 0.05, "always": 0.05, "never": 0.05,
    "确定": 0.1, "肯定": 0.1, "一定": 0.1, "绝对": 0.1, "确实": 0.1, "当然": 0.1,
    "没错": 0.1,
}  # fmt: skip
"""Cue -> confidence shift; hedges lower it, assertions raise it."""

NEGATORS = (
    "not", "no", "never", "don't", "dont", "doesn't", "didn't", "isn't", "wasn't",
    "aren't", "weren't", "won't", "can't", "cannot", "couldn't", "wouldn't",
    "shouldn't", "hardly", "nor", "without",
)  # fmt: skip
INTENSIFIERS = (
    "very", "so", "really", "extremely", "super", "totally", "absolutely", "too",
    "incredibly", "truly", "quite", "非常", "特别", "十分", "极其", "超级", "无比",
    "真的", "太", "很", "超", "好", "真", "最",
)  # fmt: skip
