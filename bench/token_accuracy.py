"""Compare HeuristicEstimator with real o200k/cl100k BPE counts on the corpus and CJK samples.

tiktoken downloads its vocabularies at run time; the `bpe-openai` wheel (PyPI) ships them inside.
It is the project's `bench` extra, installed by `make bench`; by hand:
    .venv/bin/pip install -e '.[bench]' && .venv/bin/python -m bench.token_accuracy
Prints estimate/real per text family; the bar is within +-15%.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from bench.corpus import corpus_dir, read_corpus
from compaction.tokens import CL100K, O200K, HeuristicEstimator, Rates

TEXTS_PER_FILE = 3000

# Written for this benchmark (the corpus holds no CJK): requests, facts and errors as agents see them.
CJK_SAMPLES = {
    "chinese": (
        "我们的团队正在开发一个新的数据处理系统。这个系统需要在下周五之前完成数据库迁移，并且要保证所有的"
        "历史记录都不会丢失。用户提出希望界面保持简洁，同时支持导出为表格文件。昨天的测试中发现了三个错误："
        "登录超时、报表生成失败以及缓存没有及时更新。请先修复登录超时的问题，然后再检查缓存的配置文件。"
    ),
    "japanese": (
        "先週の会議で決まったことをまとめます。新しいサーバーは来月から稼働する予定です。データベースの移行"
        "作業は金曜日までに終わらせる必要があります。ユーザーからは、画面をもっとシンプルにしてほしいという"
        "要望がありました。テストでは三つの不具合が見つかりました。ログインのタイムアウト、レポート生成の失敗、"
        "そしてキャッシュの更新が遅れる問題です。"
    ),
    "korean": (
        "지난주 회의에서 결정된 사항을 정리합니다. 새로운 서버는 다음 달부터 운영될 예정입니다. 데이터베이스 "
        "이전 작업은 금요일까지 끝내야 합니다. 사용자들은 화면을 더 단순하게 만들어 달라고 요청했습니다."
    ),
    "chinese + code": (
        "请修改 src/app/config.py 文件中的 DATABASE_URL 配置，然后运行 `pytest tests/test_db.py -k "
        "migration` 检查迁移是否成功。错误信息是：ConnectionError: timeout after 30s。"
    ),
}


def corpus_texts() -> Iterator[tuple[str, list[str]]]:
    """Message contents and tool arguments of each corpus file (the first few thousand)."""
    for path in sorted(corpus_dir().glob("*.jsonl")):
        texts: list[str] = []
        for conv in read_corpus(path):
            for message in conv["messages"]:
                if isinstance(message.get("content"), str):
                    texts.append(message["content"])
                for call in message.get("tool_calls") or []:
                    texts.append(call["function"]["arguments"])
            if len(texts) >= TEXTS_PER_FILE:
                break
        yield path.stem, texts


def compare(label: str, texts: list[str], encoding: Any, rates: Rates) -> None:
    real = sum(len(encoding.encode(text)) for text in texts)
    estimate = sum(HeuristicEstimator(rates=rates).count_text(text) for text in texts)
    flag = "" if abs(estimate / real - 1) <= 0.15 else "   <-- outside +-15%"
    print(
        f"  {label:<38} real {real:>9}  estimate {estimate:>9}  ratio {estimate / real:5.2f}{flag}"
    )


def main() -> None:
    try:
        import bpe_openai
    except ImportError:
        print(__doc__)
        sys.exit("bpe_openai is not importable: see above")
    families = list(corpus_texts()) + [(name, [text]) for name, text in CJK_SAMPLES.items()]
    for name, rates in (("o200k_base", O200K), ("cl100k_base", CL100K)):
        encoding = bpe_openai.get_encoding(name)
        print(f"{name} (estimator rates {rates})")
        for label, texts in families:
            compare(label, texts, encoding, rates)


if __name__ == "__main__":
    main()
