// WCAG 2.2 checks the browser tests run on a live page, computed from the page itself (the
// accessibility tree over CDP, computed styles, screenshots): no checker library.
import { inflateSync } from 'node:zlib';
import type { Locator, Page } from 'playwright-core';

/** A node of Chromium's accessibility tree (CDP `Accessibility.getFullAXTree`), the parts read here. */
interface AXNode {
  nodeId: string;
  ignored: boolean;
  role?: { value?: string };
  name?: { value?: string };
  description?: { value?: string };
  properties?: Array<{ name: string; value: { value?: unknown } }>;
  backendDOMNodeId?: number;
}

/** One control as assistive technology meets it: its role, name, description and state. */
export interface AXControl {
  role: string;
  name: string;
  description: string;
  focused: boolean;
  invalid: string;
  autocomplete: string;
}

const controlRoles = new Set(['textbox', 'combobox', 'spinbutton', 'button', 'link', 'checkbox', 'radio']);

/**
 * The page's controls from the accessibility tree, in document order.
 *
 * @example
 * ```ts
 * const password = (await axControls(page)).find((control) => control.focused);
 * ```
 */
export async function axControls(page: Page): Promise<AXControl[]> {
  const cdp = await page.context().newCDPSession(page);
  try {
    const { nodes } = (await cdp.send('Accessibility.getFullAXTree')) as { nodes: AXNode[] };
    const property = (node: AXNode, name: string) => node.properties?.find((entry) => entry.name === name)?.value.value;
    const controls = nodes.filter((node) => !node.ignored && controlRoles.has(node.role?.value ?? ''));
    const out: AXControl[] = [];
    for (const node of controls) {
      let autocomplete = '';
      if (node.backendDOMNodeId !== undefined) {
        const { object } = (await cdp.send('DOM.resolveNode', { backendNodeId: node.backendDOMNodeId })) as {
          object: { objectId?: string };
        };
        if (object.objectId) {
          const result = (await cdp.send('Runtime.callFunctionOn', {
            objectId: object.objectId,
            functionDeclaration: 'function(){return this.getAttribute("autocomplete") ?? ""}',
            returnByValue: true,
          })) as { result: { value?: string } };
          autocomplete = result.result.value ?? '';
        }
      }
      out.push({
        role: node.role?.value ?? '',
        name: node.name?.value ?? '',
        description: node.description?.value ?? '',
        focused: property(node, 'focused') === true,
        invalid: String(property(node, 'invalid') ?? 'false'),
        autocomplete,
      });
    }
    return out;
  } finally {
    await cdp.detach();
  }
}

/** The document-level facts: language, title, level-one headings, duplicate ids. */
export async function documentFacts(
  page: Page,
): Promise<{ lang: string; title: string; h1: number; dupIds: string[] }> {
  return page.evaluate(() => {
    const ids = Array.from(document.querySelectorAll('[id]')).map((element) => element.id);
    return {
      lang: document.documentElement.lang,
      title: document.title,
      h1: document.querySelectorAll('h1').length,
      dupIds: ids.filter((id, index) => ids.indexOf(id) !== index),
    };
  });
}

/** A piece of text whose contrast against its background is below what WCAG 1.4.3 asks. */
export interface ContrastFailure {
  text: string;
  ratio: number;
  needed: number;
  color: string;
  background: string;
}

/**
 * Every visible text (element text and control values) whose contrast ratio against the background it
 * sits on, from the computed styles, is below 4.5:1 (3:1 for large text: 24 px, or 18.66 px bold).
 * Backgrounds are composed up the ancestors, over the white canvas.
 */
export async function contrastFailures(page: Page): Promise<ContrastFailure[]> {
  return page.evaluate(() => {
    type RGBA = [number, number, number, number];
    const parse = (value: string): RGBA => {
      const parts = value.match(/[\d.]+/g)?.map(Number) ?? [0, 0, 0];
      return [parts[0] ?? 0, parts[1] ?? 0, parts[2] ?? 0, parts[3] ?? 1];
    };
    const over = (top: RGBA, under: RGBA): RGBA => {
      const a = top[3];
      return [top[0] * a + under[0] * (1 - a), top[1] * a + under[1] * (1 - a), top[2] * a + under[2] * (1 - a), 1];
    };
    const background = (element: Element | null): RGBA => {
      const layers: RGBA[] = [];
      for (let at = element; at; at = at.parentElement) {
        const layer = parse(getComputedStyle(at).backgroundColor);
        if (layer[3] > 0) layers.push(layer);
        if (layer[3] >= 1) break;
      }
      return layers.reduceRight<RGBA>((under, layer) => over(layer, under), [255, 255, 255, 1]);
    };
    const luminance = ([r, g, b]: RGBA) => {
      const linear = (channel: number) => {
        const c = channel / 255;
        return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
      };
      return 0.2126 * linear(r) + 0.7152 * linear(g) + 0.0722 * linear(b);
    };
    const ratio = (a: RGBA, b: RGBA) => {
      const [light, dark] = [luminance(a), luminance(b)].sort((x, y) => y - x) as [number, number];
      return (light + 0.05) / (dark + 0.05);
    };
    const failures: Array<{ text: string; ratio: number; needed: number; color: string; background: string }> = [];
    const check = (element: Element, text: string) => {
      const style = getComputedStyle(element);
      const box = element.getBoundingClientRect();
      if (box.width === 0 || box.height === 0 || style.visibility === 'hidden') return;
      const size = Number.parseFloat(style.fontSize);
      const large = size >= 24 || (size >= 18.66 && Number(style.fontWeight) >= 700);
      const needed = large ? 3 : 4.5;
      const bg = background(element);
      const fg = over(parse(style.color), bg);
      const value = ratio(fg, bg);
      if (value < needed) {
        failures.push({
          text: text.trim().slice(0, 60),
          ratio: Math.round(value * 100) / 100,
          needed,
          color: style.color,
          background: `rgb(${bg.slice(0, 3).map(Math.round).join(', ')})`,
        });
      }
    };
    const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      if (node.textContent?.trim() && node.parentElement) check(node.parentElement, node.textContent);
    }
    for (const control of Array.from(document.querySelectorAll('input:not([type=hidden]), select'))) {
      const value =
        control instanceof HTMLSelectElement
          ? (control.selectedOptions[0]?.text ?? '')
          : (control as HTMLInputElement).value;
      if (value) check(control, value);
    }
    return failures;
  });
}

/**
 * How far the page scrolls sideways at its current viewport: 0 when it reflows (WCAG 1.4.10 at
 * 320 CSS px), with the elements that stick out.
 */
export async function sidewaysOverflow(page: Page): Promise<{ by: number; culprits: string[] }> {
  return page.evaluate(() => {
    const width = document.documentElement.clientWidth;
    const culprits = Array.from(document.body.querySelectorAll('*'))
      // Its box sticks out, or the text inside it does (a word too long for its line).
      .filter(
        (element) =>
          element.getBoundingClientRect().right > width + 0.5 || element.scrollWidth > element.clientWidth + 1,
      )
      .map((element) => `${element.tagName.toLowerCase()}: ${(element.textContent ?? '').trim().slice(0, 40)}`);
    return { by: document.documentElement.scrollWidth - width, culprits };
  });
}

/** What has the focus, named as a person would: its tag and its text or label. */
async function focusedName(page: Page): Promise<string> {
  return page.evaluate(() => {
    const element = document.activeElement;
    if (!element || element === document.body) return 'body';
    const label = element.id ? document.querySelector(`label[for="${element.id}"]`)?.textContent : undefined;
    return `${element.tagName.toLowerCase()}:${(label ?? element.textContent ?? '').trim()}`;
  });
}

/**
 * The tab stops of the page in order, from the top: Tab round the whole page (past its end, where the
 * focus leaves the document, and on from its start) until a stop comes round again.
 *
 * @example
 * ```ts
 * expect(await tabStops(page)).toEqual(['input:Username', 'input:Password', 'button:Sign in', 'button:Cancel']);
 * ```
 */
export async function tabStops(page: Page, limit = 60): Promise<string[]> {
  const seen: string[] = [];
  for (let i = 0; i < limit; i++) {
    await page.keyboard.press('Tab');
    const name = await focusedName(page);
    if (seen.includes(name)) break;
    seen.push(name);
  }
  const end = seen.indexOf('body');
  // No way out of the page by Tab (a keyboard trap) shows as no `body` in the round. A page with one
  // stop cannot trap (headless Chromium may wrap Tab straight back to it without passing the body).
  if (end === -1) return seen.length <= 1 ? seen : [...seen, 'trap'];
  return [...seen.slice(end + 1), ...seen.slice(0, end)];
}

/** A decoded 8-bit PNG (what Chromium's screenshots are): RGBA rows. */
function decodePng(png: Buffer): { width: number; height: number; pixel: (x: number, y: number) => number[] } {
  let offset = 8;
  let width = 0;
  let height = 0;
  let channels = 4;
  const data: Buffer[] = [];
  while (offset < png.length) {
    const length = png.readUInt32BE(offset);
    const type = png.toString('latin1', offset + 4, offset + 8);
    const chunk = png.subarray(offset + 8, offset + 8 + length);
    if (type === 'IHDR') {
      width = chunk.readUInt32BE(0);
      height = chunk.readUInt32BE(4);
      if (chunk[8] !== 8 || chunk[12] !== 0) throw new Error('only 8-bit, non-interlaced PNGs');
      channels = chunk[9] === 6 ? 4 : chunk[9] === 2 ? 3 : 0;
      if (channels === 0) throw new Error('only RGB and RGBA PNGs');
    } else if (type === 'IDAT') data.push(chunk);
    offset += 12 + length;
  }
  const raw = inflateSync(Buffer.concat(data));
  const stride = width * channels;
  const out = Buffer.alloc(stride * height);
  for (let y = 0; y < height; y++) {
    const filter = raw[y * (stride + 1)] ?? 0;
    for (let x = 0; x < stride; x++) {
      const value = raw[y * (stride + 1) + 1 + x] ?? 0;
      const left = x >= channels ? (out[y * stride + x - channels] ?? 0) : 0;
      const up = y > 0 ? (out[(y - 1) * stride + x] ?? 0) : 0;
      const upLeft = x >= channels && y > 0 ? (out[(y - 1) * stride + x - channels] ?? 0) : 0;
      let predicted = 0;
      if (filter === 1) predicted = left;
      else if (filter === 2) predicted = up;
      else if (filter === 3) predicted = Math.floor((left + up) / 2);
      else if (filter === 4) {
        const p = left + up - upLeft;
        const [pa, pb, pc] = [Math.abs(p - left), Math.abs(p - up), Math.abs(p - upLeft)];
        predicted = pa <= pb && pa <= pc ? left : pb <= pc ? up : upLeft;
      }
      out[y * stride + x] = (value + predicted) & 0xff;
    }
  }
  return {
    width,
    height,
    pixel: (x, y) => [...out.subarray(y * stride + x * channels, y * stride + x * channels + 3)],
  };
}

function relativeLuminance([r = 0, g = 0, b = 0]: number[]): number {
  const linear = (channel: number) => {
    const c = channel / 255;
    return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
  };
  return 0.2126 * linear(r) + 0.7152 * linear(g) + 0.0722 * linear(b);
}

/**
 * How visible the focus of `element` is: the pixels around it that change when it takes
 * the focus from the keyboard, and the best contrast between a changed pixel and what it was (WCAG
 * 2.4.7, and 1.4.11's 3:1 for the indicator).
 */
export async function focusIndicator(page: Page, element: Locator): Promise<{ changed: number; contrast: number }> {
  await element.scrollIntoViewIfNeeded();
  await page.evaluate(() => (document.activeElement as HTMLElement | null)?.blur());
  const box = await element.boundingBox();
  if (!box) throw new Error(`${element} is not visible`);
  const clip = { x: Math.max(0, box.x - 6), y: Math.max(0, box.y - 6), width: box.width + 12, height: box.height + 12 };
  const before = decodePng(await page.screenshot({ clip }));
  // Focus by keyboard (:focus-visible): Tab from a stepping stone put just before it, out of sight.
  await element.evaluate((target) => {
    const stone = document.createElement('span');
    stone.tabIndex = -1;
    stone.id = 'a11y-stepping-stone';
    stone.style.cssText = 'position:fixed;left:0;top:0;width:1px;height:1px;overflow:hidden';
    target.before(stone);
    stone.focus();
  });
  await page.keyboard.press('Tab');
  const reached = await element.evaluate((target) => {
    document.getElementById('a11y-stepping-stone')?.remove();
    return target === document.activeElement;
  });
  if (!reached) throw new Error(`Tab missed ${element}`);
  const after = decodePng(await page.screenshot({ clip }));
  let changed = 0;
  let contrast = 1;
  for (let y = 0; y < Math.min(before.height, after.height); y++) {
    for (let x = 0; x < Math.min(before.width, after.width); x++) {
      const a = before.pixel(x, y);
      const b = after.pixel(x, y);
      if (a.every((value, index) => value === b[index])) continue;
      changed += 1;
      const [light, dark] = [relativeLuminance(a), relativeLuminance(b)].sort((p, q) => q - p) as [number, number];
      contrast = Math.max(contrast, (light + 0.05) / (dark + 0.05));
    }
  }
  return { changed, contrast: Math.round(contrast * 100) / 100 };
}

/**
 * What WCAG 1.4.12 asks a page to survive: a person's own style sheet with wider line, paragraph,
 * letter and word spacing. Returns the elements that then clip or stick out of their box.
 */
export async function textSpacingLosses(page: Page): Promise<string[]> {
  return page.evaluate(() => {
    const style = document.createElement('style');
    style.textContent =
      '*{line-height:1.5!important;letter-spacing:.12em!important;word-spacing:.16em!important}p{margin-bottom:2em!important}';
    document.head.append(style);
    const width = document.documentElement.clientWidth;
    const losses = Array.from(document.body.querySelectorAll('*'))
      .filter((element) => {
        const overflow = getComputedStyle(element).overflow;
        const clipped = overflow !== 'visible' && element.scrollWidth > element.clientWidth + 1;
        return clipped || element.getBoundingClientRect().right > width + 0.5;
      })
      .map((element) => `${element.tagName.toLowerCase()}: ${(element.textContent ?? '').trim().slice(0, 40)}`);
    style.remove();
    return losses;
  });
}
